"""Recipe statistics of the examples stage on real Wikipedia text (docs/recipe.md).

Builds a corpus from ``../shared/data`` with the pipeline's own clean and tokenizer steps
(:func:`bench.corpus.prepare`: default the first 10 files of the WikiExtractor extract, ~10 MB,
507 train articles in Wikipedia's order, vocabulary 16000), runs
:func:`pipeline.data.examples.generate_examples` once per seed (``dupe_factor: 1``, static masking)
on the train split and prints mean and std over the seeds of:

* ``instances`` (train rows), ``nsp_random`` (NotNext share), mean A / B lengths, ``short_rows``
  (rows under ``max_seq_len``);
* ``full_lo_hi`` / ``full_hi_lo``: share of full rows split ``m//2 / m//2+1`` or
  ``m//2+1 / m//2`` (A/B), ``m = max_seq_len - 3`` (62/63 vs 63/62 at 128; Google: the second);
* NotNext pairs, how close B is to A's topic. ``seg_cos``: TF-IDF cosine of the A and B
  segments (words, English stop words removed, idf fitted on the segments); ``doc_cos``: of the
  articles they come from (idf over the articles); ``near``: share whose B article lies within
  10 articles of A's in corpus order. ``base_*``: the same with every A paired with the B of a
  random other NotNext row from another article, i.e. negatives drawn from the whole corpus
  (Google's pool). The
  article of a segment is found by its first 8 token ids (segments shorter than 8 are skipped);
* ``masked_per_row`` and ``unk_label_share`` (share of masked labels that are ``[UNK]``; also on
  the valid split, whose text the tokenizer did not see: the train split has no ``[UNK]`` here).

    python bench/recipe_stats.py                                       # this tree, params.yaml's recipe
    python bench/recipe_stats.py --set shuffle_documents=false --set mask_candidates=skip_special
    git archive 94344c6 pipeline | tar -x -C /tmp/old && python bench/recipe_stats.py --code /tmp/old

(``--code``: import ``pipeline`` from another directory, e.g. an older commit, to measure it.)
About 10 s per seed on one core, plus ~1 min to prepare the corpus once.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 8  # token ids that identify a segment's article


def _parse(value: str):
    import yaml

    return yaml.safe_load(value)


def _segments(table, unk_id: int, sep_id: int):
    """Unmasked A and B ids per row, NSP labels, masked positions and [UNK] labels."""
    ids = table["input_ids"].to_pylist()
    nsp = table["next_sentence_label"].to_numpy()
    masked = unk = 0
    if "masked_lm_positions" in table.column_names:
        for row, pos, lab in zip(ids, table["masked_lm_positions"].to_pylist(), table["masked_lm_ids"].to_pylist()):
            for p, label in zip(pos, lab):
                row[p] = label
            masked += len(pos)
            unk += sum(1 for label in lab if label == unk_id)
    a, b = [], []
    for row in ids:
        sep = row.index(sep_id, 1)
        a.append(row[1:sep])
        b.append(row[sep + 1 : -1])
    return a, b, nsp, masked, unk


def _hash(windows: np.ndarray) -> np.ndarray:
    """One uint64 per row of token ids (polynomial, wrapping)."""
    h = np.zeros(len(windows), dtype=np.uint64)
    for k in range(windows.shape[1]):
        h = h * np.uint64(1000003) + windows[:, k].astype(np.uint64)
    return h


class _ArticleIndex:
    """Which article a token span comes from: every ``WINDOW``-gram of every article, hashed."""

    def __init__(self, docs: list[str], tok):
        from pipeline.data.encode import SentenceEncoder
        from pipeline.data.sentences import split_sentences

        enc = SentenceEncoder(tok, np.uint32)
        keys, owners = [], []
        for d, text in enumerate(docs):
            ids, _ = enc.encode(split_sentences(text))
            if len(ids) >= WINDOW:
                keys.append(_hash(np.lib.stride_tricks.sliding_window_view(ids, WINDOW)))
                owners.append(np.full(len(keys[-1]), d, dtype=np.int64))
        keys, owners = np.concatenate(keys), np.concatenate(owners)
        order = np.argsort(keys, kind="stable")
        keys, owners = keys[order], owners[order]
        first = np.r_[True, keys[1:] != keys[:-1]]
        group = np.cumsum(first) - 1
        ambiguous = np.zeros(int(group[-1]) + 1, dtype=bool)
        np.logical_or.at(ambiguous, group[1:][~first[1:]], owners[1:][~first[1:]] != owners[:-1][~first[1:]])
        self.keys, self.owner = keys[first], np.where(ambiguous, -1, owners[first])

    def article(self, spans: list[list[int]]) -> np.ndarray:
        """Article index of each span, -1 when shorter than ``WINDOW`` or not unique."""
        out = np.full(len(spans), -1, dtype=np.int64)
        ok = [i for i, s in enumerate(spans) if len(s) >= WINDOW]
        if ok:
            h = _hash(np.array([spans[i][:WINDOW] for i in ok], dtype=np.uint32))
            at = np.minimum(np.searchsorted(self.keys, h), len(self.keys) - 1)
            out[ok] = np.where(self.keys[at] == h, self.owner[at], -1)
        return out


def _row_cosines(xa, xb) -> np.ndarray:
    return np.asarray(xa.multiply(xb).sum(axis=1)).ravel()  # rows are L2-normalised


def measure(work: Path, cfg_kwargs: dict, seed: int, out: Path, cache: dict) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.feature_extraction.text import TfidfVectorizer

    from pipeline.data.examples import ExamplesConfig, generate_examples
    from pipeline.data.tokenizer import load_tokenizer

    train, tokenizer = work / "clean" / "train.txt", work / "tokenizer" / "tokenizer.json"
    cfg = ExamplesConfig(**{**cfg_kwargs, "seed": seed})
    manifest = generate_examples(train, work / "clean" / "valid.txt", tokenizer, out, cfg, workers=1, progress=False)
    table = pa.concat_tables([pq.read_table(out / s["path"]) for s in manifest["splits"]["train"]["shards"]])
    special = manifest["special_ids"]
    a, b, nsp, masked, unk = _segments(table, special["[UNK]"], special["[SEP]"])
    la, lb = np.array([len(x) for x in a]), np.array([len(x) for x in b])
    total = la + lb + 3
    m = cfg.max_seq_len - 3
    full = total == cfg.max_seq_len

    tok = load_tokenizer(tokenizer)
    if "index" not in cache:
        docs = [line.strip() for line in train.read_text(encoding="utf-8").splitlines() if line.strip()]
        cache["index"] = _ArticleIndex(docs, tok)
        cache["doc_vec"] = TfidfVectorizer(stop_words="english").fit_transform(docs)
    index, doc_vec = cache["index"], cache["doc_vec"]

    rnd = np.flatnonzero(nsp == 1)
    rng = np.random.default_rng(seed)
    other = rng.integers(0, len(rnd) - 1, size=len(rnd))
    other += other >= np.arange(len(rnd))  # a uniformly random other NotNext row's B
    text_a = tok.decode_batch([a[i] for i in rnd])
    text_b = tok.decode_batch([b[i] for i in rnd])
    seg_vec = TfidfVectorizer(stop_words="english").fit(text_a + text_b)
    xa, xb = seg_vec.transform(text_a), seg_vec.transform(text_b)
    art_a, art_b = index.article([a[i] for i in rnd]), index.article([b[i] for i in rnd])
    known = (art_a >= 0) & (art_b >= 0)
    other_article = (art_a != art_b[other]) | (art_a < 0)  # the baseline's B is never from A's own article either
    known_base = known & known[other] & other_article
    seg_cos, seg_base = _row_cosines(xa, xb), _row_cosines(xa, xb[other])[other_article]
    da, db = doc_vec[np.maximum(art_a, 0)], doc_vec[np.maximum(art_b, 0)]
    doc_cos, doc_base = _row_cosines(da, db)[known], _row_cosines(da, db[other])[known_base]
    near = (np.abs(art_a - art_b) <= 10)[known]
    near_base = (np.abs(art_a - art_b[other]) <= 10)[known_base]
    valid = pa.concat_tables([pq.read_table(out / s["path"]) for s in manifest["splits"]["valid"]["shards"]])
    *_, valid_masked, valid_unk = _segments(valid, special["[UNK]"], special["[SEP]"])
    return {
        "instances": len(nsp),
        "nsp_random": float(nsp.mean()),
        "len_a": float(la.mean()),
        "len_b": float(lb.mean()),
        "short_rows": float((total < cfg.max_seq_len).mean()),
        "full_lo_hi": float(((la == m // 2) & (lb == m - m // 2))[full].mean()) if full.any() else 0.0,
        "full_hi_lo": float(((la == m - m // 2) & (lb == m // 2))[full].mean()) if full.any() else 0.0,
        "seg_cos": float(seg_cos.mean()),
        "seg_cos>0.2": float((seg_cos > 0.2).mean()),
        "base_seg_cos": float(seg_base.mean()),
        "base_seg_cos>0.2": float((seg_base > 0.2).mean()),
        "doc_cos": float(doc_cos.mean()),
        "doc_cos>0.2": float((doc_cos > 0.2).mean()),
        "base_doc_cos": float(doc_base.mean()),
        "base_doc_cos>0.2": float((doc_base > 0.2).mean()),
        "near": float(near.mean()),
        "base_near": float(near_base.mean()),
        "articles_found": float(known.mean()),
        "masked_per_row": masked / max(len(nsp), 1),
        "unk_label_share": unk / max(masked, 1),
        "valid_unk_label_share": valid_unk / max(valid_masked, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default="enwiki10", help="bench source (bench/corpus.py): enwikiN or wikitext")
    ap.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "bertrace-recipe-stats",
        help="where the prepared corpus is kept (reused when present)",
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an examples param (e.g. shuffle_documents=false); repeatable",
    )
    ap.add_argument("--code", type=Path, help="import `pipeline` from this directory (e.g. an older commit)")
    ap.add_argument("--label", default="", help="a name for this configuration in the printed table")
    ap.add_argument("--json", type=Path, help="also write the per-seed results here")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT))
    if args.code:
        sys.path.insert(0, str(args.code.resolve()))
    from corpus import prepare

    import pipeline

    work = prepare(args.source, 1, args.work / args.source)
    cfg_kwargs = {"max_seq_len": 128, "dupe_factor": 1, "masking": "static"}
    for kv in args.set:
        key, _, value = kv.partition("=")
        cfg_kwargs[key] = _parse(value)
    runs, cache = [], {}
    for seed in args.seeds:
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(measure(work, cfg_kwargs, seed, Path(tmp), cache))
        print(f"seed {seed}: {time.time() - t0:.0f} s", file=sys.stderr)
    print(
        f"## {args.label or 'examples'}: {args.source}, {json.dumps(cfg_kwargs)}, seeds {args.seeds}, "
        f"pipeline from {Path(pipeline.__file__).parent}"
    )
    print(f"| {'statistic':<21} | {'mean':>10} | {'std':>8} |")
    print(f"|{'-' * 23}|{'-' * 12}|{'-' * 10}|")
    for key in runs[0]:
        vals = np.array([r[key] for r in runs], dtype=float)
        print(f"| {key:<21} | {vals.mean():>10.4f} | {vals.std():>8.4f} |")
    if args.json:
        args.json.write_text(json.dumps({"config": cfg_kwargs, "seeds": args.seeds, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
