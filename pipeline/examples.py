"""MLM + NSP pre-training examples: Google's ``create_pretraining_data.py`` recipe, sharded.

Per document (one line of the clean corpus), following ``create_instances_from_document``:

1. split it into sentences (:func:`pipeline.sentences.split_sentences`) and WordPiece them
   (``Tokenizer.encode_batch``, no special tokens); sentences with no tokens are dropped;
2. draw a target length: ``max_seq_len - 3`` (room for ``[CLS] [SEP] [SEP]``), or with
   probability ``short_seq_prob`` a random one in ``[2, max_seq_len - 3]`` (once per
   document, as Google does);
3. gather sentences into a chunk until it reaches the target (or the document ends); the
   first ``a_end`` (random, ``1..len(chunk)-1``) sentences are segment A;
4. B is the rest of the chunk (IsNext), or with probability 0.5 (always when the chunk has a
   single sentence) sentences from a random start in a random *other* document (NotNext),
   in which case the chunk's unused sentences are put back (``i -= num_unused_segments``);
5. ``truncate_seq_pair``: drop tokens from the longer side, each from the front or the back
   with probability 0.5, until ``len(A) + len(B) <= max_seq_len - 3``;
6. ``[CLS] A [SEP] B [SEP]``; static masking corrupts it here (the recipe of
   :func:`pipeline.masking.mask_sequence`), dynamic masking leaves that to the loader.

``dupe_factor`` (train) / ``valid_dupe_factor`` (valid) passes over the corpus, each with
its own pairing and masking.

Sharding, determinism, memory. The corpus is cut into partitions of ``docs_per_shard``
documents in file order (a trailing partition of fewer than 2 documents joins the previous
one). Each partition is tokenized once and, for every dupe pass ``d``, written to its own
shard ``shard-{partition * dupes + d:05d}.parquet`` using RNGs seeded only from
``(seed, split, partition, d)``. NotNext documents are drawn from the same partition.
Shards are therefore byte-identical for any number of worker processes, and the main
process holds at most ``2 * workers`` partitions in memory at a time.

Deviations from Google, on purpose:
* Google shuffles all instances of the corpus at once; we shuffle the instances within each
  shard and the loader shuffles the shard order (bounded memory, parallel writing).
* The random document is drawn uniformly among the *other* documents of the partition
  (Google: 10 tries to avoid the same document, then gives up), so NotNext B never comes
  from A's document. The pool of negatives is the partition, not the whole corpus. A
  partition left with one usable document makes IsNext pairs only.
* Truncation draws the final front/back split directly (a binomial over the number of
  tokens removed from each side), which has the same distribution as Google's
  token-at-a-time loop.
* Static masking (without whole-word masking) is drawn for a whole shard at once by
  :func:`_mask_rows`, the recipe of :func:`pipeline.masking.mask_sequence` (which the
  loader uses for dynamic masking, and we use for whole-word masking) vectorized over rows;
  the two differ only in how they consume random numbers. See :mod:`pipeline.masking` for
  how the recipe itself differs from Google's (random replacements exclude special ids).
* The pairing loop draws from a ``random.Random`` (cheap scalar draws); the shard shuffle and
  masking from a numpy Generator. Both are seeded from ``(seed, split, partition, dupe)``.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import random
from dataclasses import asdict, dataclass, fields
from itertools import chain
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from pipeline.errors import BertraceError
from pipeline.io import atomic_path, sha256_file, write_json
from pipeline.masking import MaskingSpec, mask_sequence
from pipeline.sentences import split_sentences
from pipeline.tokenizer import SPECIAL_IDS, load_tokenizer

SCHEMA_VERSION = 1
CLS_ID, SEP_ID, MASK_ID = SPECIAL_IDS["[CLS]"], SPECIAL_IDS["[SEP]"], SPECIAL_IDS["[MASK]"]
SPLIT_IDS = {"train": 0, "valid": 1}
MASKING_MODES = ("static", "dynamic")


@dataclass
class ExamplesConfig:
    """The ``examples`` section of params.yaml (minus ``workers``, which only sets speed)."""

    max_seq_len: int = 128
    short_seq_prob: float = 0.1
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    dupe_factor: int = 5
    valid_dupe_factor: int = 1
    masking: str = "static"
    whole_word_masking: bool = False
    docs_per_shard: int = 256
    row_group_size: int = 4096
    seed: int = 12345

    def __post_init__(self):
        def bad(name: str, why: str):
            value = getattr(self, name)
            raise BertraceError(f"params.yaml examples.{name} = {value!r}: {why}; fix it in params.yaml")

        for name in ("max_seq_len", "max_predictions_per_seq", "dupe_factor", "valid_dupe_factor",
                     "docs_per_shard", "row_group_size", "seed"):
            if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool):
                bad(name, "must be an integer")
        for name in ("short_seq_prob", "masked_lm_prob"):
            if not isinstance(getattr(self, name), (int, float)) or isinstance(getattr(self, name), bool):
                bad(name, "must be a number")
        if not 8 <= self.max_seq_len <= 65535:
            bad("max_seq_len", "must be in [8, 65535]")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            bad("short_seq_prob", "must be in [0, 1]")
        if not 0.0 < self.masked_lm_prob < 1.0:
            bad("masked_lm_prob", "must be in (0, 1)")
        if self.max_predictions_per_seq < 1:
            bad("max_predictions_per_seq", "must be >= 1")
        if self.dupe_factor < 1:
            bad("dupe_factor", "must be >= 1")
        if self.valid_dupe_factor < 1:
            bad("valid_dupe_factor", "must be >= 1")
        if self.masking not in MASKING_MODES:
            bad("masking", f"must be one of {', '.join(MASKING_MODES)}")
        if not isinstance(self.whole_word_masking, bool):
            bad("whole_word_masking", "must be true or false")
        if self.docs_per_shard < 2:
            bad("docs_per_shard", "must be >= 2 (NSP negatives come from the same shard)")
        if self.row_group_size < 1:
            bad("row_group_size", "must be >= 1")
        if self.seed < 0:
            bad("seed", "must be >= 0")

    @classmethod
    def from_params(cls, params: dict) -> "ExamplesConfig":
        """Build from the params.yaml section; ``workers`` is ignored, unknown keys are errors."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known - {"workers"})
        if unknown:
            raise BertraceError(f"params.yaml examples: unknown key(s) {', '.join(unknown)}; "
                                f"known keys are {', '.join(sorted(known | {'workers'}))}")
        return cls(**{k: v for k, v in params.items() if k in known})


# ----------------------------------------------------------------------------- tokenizer


def _id_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 65536 else np.uint32


def _masking_spec(tok, cfg: ExamplesConfig) -> MaskingSpec:
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    is_cont = None
    if cfg.whole_word_masking:
        is_cont = np.zeros(vocab_size, dtype=bool)
        for piece, i in tok.get_vocab(with_added_tokens=True).items():
            if piece.startswith("##"):
                is_cont[i] = True
    return MaskingSpec(vocab_size=vocab_size, mask_id=MASK_ID, special_ids=tuple(SPECIAL_IDS.values()),
                       masked_lm_prob=cfg.masked_lm_prob, max_predictions_per_seq=cfg.max_predictions_per_seq,
                       whole_word_masking=cfg.whole_word_masking, is_continuation=is_cont)


# ----------------------------------------------------------------------------- one partition


def truncation_amounts(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """How many tokens Google's ``truncate_seq_pair`` removes from A and from B.

    It pops from the longer side (A on ties) until the pair fits; the result depends only on
    the lengths, so we compute it in closed form.
    """
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0
    gap = abs(len_a - len_b)
    if excess <= gap:
        return (excess, 0) if len_a >= len_b else (0, excess)
    rest = excess - gap  # sides are equal now; A goes first on ties
    if len_a >= len_b:
        return gap + (rest + 1) // 2, rest // 2
    return (rest + 1) // 2, gap + rest // 2


class _Partition:
    """Sentences of one partition's documents as one flat token array.

    Sentence ``j`` is ``tokens[off[j]:off[j+1]]``; document ``d`` is sentences
    ``doc_first[d] .. doc_first[d] + doc_n[d] - 1``. A document's sentences are contiguous,
    so every A or B segment is a contiguous slice ``tokens[lo:hi]``.
    """

    def __init__(self, docs: list[str], tok, id_dtype):
        sentences: list[str] = []
        per_doc: list[int] = []
        for text in docs:
            s = split_sentences(text)
            sentences.extend(s)
            per_doc.append(len(s))
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets we do not need
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
        ids = [e.ids for e in encode(sentences, add_special_tokens=False)] if sentences else []
        lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        self.tokens = np.fromiter(chain.from_iterable(ids), dtype=id_dtype, count=int(lens.sum()))
        keep = lens > 0
        doc_of = np.repeat(np.arange(len(docs)), per_doc)[keep]
        counts = np.bincount(doc_of, minlength=len(docs))
        counts = counts[counts > 0]
        self.off = np.concatenate([[0], np.cumsum(lens[keep])]).tolist()
        self.doc_n = counts.tolist()
        self.doc_first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64).tolist() if len(counts) else []

    @property
    def num_docs(self) -> int:
        return len(self.doc_n)


def _pairs_for_document(part: _Partition, d: int, cfg: ExamplesConfig, rng: random.Random, out: list):
    """Append ``(a_lo, a_hi, b_lo, b_hi, is_random_next)`` for document ``d`` (Google's loop).

    ``rng`` is a ``random.Random``: this loop makes a few scalar draws per example, which
    are ~10x cheaper there than with a numpy Generator.
    """
    off, first, n = part.off, part.doc_first[d], part.doc_n[d]
    ndocs = part.num_docs
    max_num_tokens = cfg.max_seq_len - 3
    target = max_num_tokens
    if rng.random() < cfg.short_seq_prob:
        target = rng.randint(2, max_num_tokens)
    chunk_start, length, i = 0, 0, 0
    while i < n:
        length += off[first + i + 1] - off[first + i]
        if i == n - 1 or length >= target:
            k = i - chunk_start + 1  # sentences in the chunk
            a_end = 1 if k < 2 else rng.randint(1, k - 1)
            a_lo, a_hi = off[first + chunk_start], off[first + chunk_start + a_end]
            if (k == 1 or rng.random() < 0.5) and ndocs > 1:
                r = rng.randrange(ndocs - 1)
                r += r >= d  # uniform over the other documents
                r_first, r_n = part.doc_first[r], part.doc_n[r]
                start = rng.randrange(r_n)
                target_b = target - (a_hi - a_lo)
                j = start
                while j < r_n:
                    j += 1
                    if off[r_first + j] - off[r_first + start] >= target_b:
                        break
                b_lo, b_hi, random_next = off[r_first + start], off[r_first + j], True
                i -= k - a_end  # put the unused sentences back
            elif k == 1:  # a one-document partition (after dropping empty ones): no pair
                b_lo = b_hi = None
            else:
                b_lo, b_hi, random_next = a_hi, off[first + i + 1], False
            if b_lo is not None:
                cut_a, cut_b = truncation_amounts(a_hi - a_lo, b_hi - b_lo, max_num_tokens)
                if cut_a:  # each removed token came from the front with p=0.5: Binomial(cut, 0.5)
                    front = rng.getrandbits(cut_a).bit_count()
                    a_lo, a_hi = a_lo + front, a_hi - (cut_a - front)
                if cut_b:
                    front = rng.getrandbits(cut_b).bit_count()
                    b_lo, b_hi = b_lo + front, b_hi - (cut_b - front)
                out.append((a_lo, a_hi, b_lo, b_hi, random_next))
            chunk_start, length = i + 1, 0
        i += 1


def _gather_rows(tokens: np.ndarray, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat ``[CLS] A [SEP] B [SEP]`` ids, token_type_ids and row offsets, without a row loop.

    ``pairs`` has columns ``a_lo, a_hi, b_lo, b_hi``. Each row is 5 runs (CLS, A, SEP, B,
    SEP); a run of length ``n`` copies ``ext[src : src + n]`` where ``ext`` is ``tokens``
    followed by the two special ids.
    """
    n = len(pairs)
    ext = np.concatenate([tokens, np.array([CLS_ID, SEP_ID], dtype=tokens.dtype)])
    cls_at, sep_at = len(tokens), len(tokens) + 1
    len_a, len_b = pairs[:, 1] - pairs[:, 0], pairs[:, 3] - pairs[:, 2]
    run_len = np.stack([np.ones(n, np.int64), len_a, np.ones(n, np.int64), len_b, np.ones(n, np.int64)], 1).ravel()
    run_src = np.stack([np.full(n, cls_at), pairs[:, 0], np.full(n, sep_at), pairs[:, 2], np.full(n, sep_at)], 1).ravel()
    run_dst = np.cumsum(run_len) - run_len
    total = int(run_len.sum())
    src = np.repeat(run_src - run_dst, run_len) + np.arange(total)
    ids = ext[src]
    types = np.repeat(np.tile(np.array([0, 1], dtype=np.uint8), n), np.stack([len_a + 2, len_b + 1], 1).ravel())
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(len_a + len_b + 3, out=offsets[1:])
    return ids, types, offsets


def _mask_rows(ids: np.ndarray, offsets: np.ndarray, rng: np.random.Generator, spec: MaskingSpec):
    """Static masking of all rows at once: the recipe of :func:`pipeline.masking.mask_sequence`.

    Per row ``num_to_predict = min(max_predictions_per_seq, max(1, round(len * p)))``
    positions uniformly among its non-special tokens (an i.i.d. random key per candidate,
    the smallest keys win: a uniform random subset), then 80% ``[MASK]`` / 10% unchanged / 10% a random non-special id.
    Returns ``(masked_ids, positions_within_row, labels, positions_per_row)``.
    """
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return ids.copy(), empty, ids[:0].copy(), empty
    row_of = np.repeat(np.arange(n), lengths)
    col_of = np.arange(len(ids)) - offsets[row_of]
    is_special = np.zeros(spec.vocab_size, dtype=bool)
    is_special[list(spec.special_ids)] = True
    cand = ~is_special[ids]
    want = np.minimum(spec.max_predictions_per_seq, np.maximum(1, np.rint(lengths * spec.masked_lm_prob))).astype(np.int64)

    # One row of random keys per example (inf = not a candidate); the `want` smallest win.
    width = int(lengths.max())
    keys = np.full((n, width), np.inf)
    keys[row_of[cand], col_of[cand]] = rng.random(int(cand.sum()))
    k = min(spec.max_predictions_per_seq, width)
    if k < width:
        cols = np.argpartition(keys, k - 1, axis=1)[:, :k]  # the k smallest, unordered
    else:
        cols = np.broadcast_to(np.arange(width), (n, width))
    sub = np.take_along_axis(keys, cols, axis=1)
    order = np.argsort(sub, axis=1)
    cols, sub = np.take_along_axis(cols, order, axis=1), np.take_along_axis(sub, order, axis=1)
    take = (np.arange(k) < want[:, None]) & np.isfinite(sub)
    chosen = np.sort(offsets[np.nonzero(take)[0]] + cols[take])  # flat positions, by row, increasing

    labels = ids[chosen]
    out = ids.copy()
    roll = rng.random(len(chosen))
    out[chosen[roll < 0.8]] = spec.mask_id
    to_random = chosen[roll >= 0.9]
    out[to_random] = rng.integers(spec.first_random_id, spec.vocab_size, size=len(to_random))
    per_row = np.bincount(row_of[chosen], minlength=n)
    return out, chosen - offsets[row_of[chosen]], labels, per_row


def _list_column(values: np.ndarray, lengths_or_offsets: np.ndarray, dtype, *, offsets: bool) -> pa.ListArray:
    """A list<dtype> Arrow column from flat numpy values plus per-row lengths or offsets."""
    if offsets:
        offs = lengths_or_offsets.astype(np.int32)
    else:
        offs = np.zeros(len(lengths_or_offsets) + 1, dtype=np.int32)
        np.cumsum(lengths_or_offsets, out=offs[1:])
    return pa.ListArray.from_arrays(pa.array(offs, type=pa.int32()), pa.array(values.astype(dtype, copy=False)))


def shard_schema(id_dtype, masking: str) -> pa.Schema:
    id_type = pa.from_numpy_dtype(id_dtype)
    cols = [pa.field("input_ids", pa.list_(id_type)), pa.field("token_type_ids", pa.list_(pa.uint8())),
            pa.field("next_sentence_label", pa.int8())]
    if masking == "static":
        cols += [pa.field("masked_lm_positions", pa.list_(pa.uint16())), pa.field("masked_lm_ids", pa.list_(id_type))]
    return pa.schema(cols)


class _Worker:
    """Everything one process needs: tokenizer, masking spec, config, output directory."""

    def __init__(self, tokenizer_json: str, cfg: ExamplesConfig, out_dir: str):
        self.tok = load_tokenizer(tokenizer_json)
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.spec = _masking_spec(self.tok, cfg)
        self.id_dtype = _id_dtype(self.spec.vocab_size)
        self.schema = shard_schema(self.id_dtype, cfg.masking)

    def process(self, split: str, partition: int, docs: list[str], dupes: int) -> list[dict]:
        """Tokenize one partition once and write its ``dupes`` shards; return their stats."""
        part = _Partition(docs, self.tok, self.id_dtype)
        return [self._write_shard(split, partition, d, part, dupes) for d in range(dupes)]

    def _write_shard(self, split: str, partition: int, dupe: int, part: _Partition, dupes: int) -> dict:
        cfg = self.cfg
        key = f"bertrace-examples/{cfg.seed}/{split}/{partition}/{dupe}"
        pair_rng = random.Random(key)  # str seeds are hashed with sha512: stable across runs
        np_rng = np.random.default_rng([cfg.seed, SPLIT_IDS[split], partition, dupe])

        pairs: list[tuple] = []
        for d in range(part.num_docs):
            _pairs_for_document(part, d, cfg, pair_rng, pairs)
        pairs = np.array(pairs, dtype=np.int64).reshape(-1, 5)
        pairs = pairs[np_rng.permutation(len(pairs))]  # shuffle within the shard
        nsp = pairs[:, 4].astype(np.int8)

        ids, types, offsets = _gather_rows(part.tokens, pairs[:, :4])
        masked = 0
        if cfg.masking == "static":
            if cfg.whole_word_masking:  # word grouping is per row: use the shared per-row code
                rows = [mask_sequence(ids[offsets[r]:offsets[r + 1]], np_rng, self.spec) for r in range(len(pairs))]
                ids = np.concatenate([r[0] for r in rows]) if rows else ids
                positions = np.concatenate([r[1] for r in rows] + [np.zeros(0, np.int64)])
                labels = np.concatenate([r[2] for r in rows] + [np.zeros(0, ids.dtype)])
                per_row = np.array([len(r[1]) for r in rows], dtype=np.int64)
            else:
                ids, positions, labels, per_row = _mask_rows(ids, offsets, np_rng, self.spec)
            masked = len(positions)

        columns = [
            _list_column(ids, offsets, self.id_dtype, offsets=True),
            _list_column(types, offsets, np.uint8, offsets=True),
            pa.array(nsp, type=pa.int8()),
        ]
        if cfg.masking == "static":
            columns += [_list_column(positions, per_row, np.uint16, offsets=False),
                        _list_column(labels, per_row, self.id_dtype, offsets=False)]
        table = pa.Table.from_arrays(columns, schema=self.schema)

        index = partition * dupes + dupe
        rel = f"{split}/shard-{index:05d}.parquet"
        path = self.out_dir / rel
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp, compression="zstd", row_group_size=cfg.row_group_size)
        return {
            "index": index, "path": rel, "rows": len(pairs), "tokens": int(offsets[-1]),
            "sha256": sha256_file(path), "random_next": int(nsp.sum()), "masked": masked,
        }


# Per-process state of pool workers (set once by the initializer; never used in the parent).
_POOL_WORKER: _Worker | None = None


def _init_pool_worker(tokenizer_json: str, cfg: ExamplesConfig, out_dir: str):
    global _POOL_WORKER
    # N worker processes already use the cores; the Rust thread pool would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _POOL_WORKER = _Worker(tokenizer_json, cfg, out_dir)


def _pool_task(split: str, partition: int, docs: list[str], dupes: int) -> list[dict]:
    return _POOL_WORKER.process(split, partition, docs, dupes)


# ----------------------------------------------------------------------------- corpus


def _count_documents(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                n += 1
    return n


def partition_sizes(num_docs: int, docs_per_shard: int) -> list[int]:
    """Fixed partitions in file order; a trailing one of < 2 documents joins the previous one."""
    sizes = [docs_per_shard] * (num_docs // docs_per_shard)
    rest = num_docs % docs_per_shard
    if rest:
        if rest < 2 and sizes:
            sizes[-1] += rest
        else:
            sizes.append(rest)
    return sizes


def _read_partitions(path: Path, sizes: list[int]) -> Iterator[list[str]]:
    docs: list[str] = []
    p = 0
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                if p == len(sizes):
                    raise BertraceError(f"{path}: changed while being read; rerun the examples stage")
                docs.append(line)
                if len(docs) == sizes[p]:
                    yield docs
                    docs, p = [], p + 1
    except UnicodeDecodeError as e:
        raise BertraceError(f"{path}: not valid UTF-8 ({e}); rerun the clean stage") from None
    if docs or p != len(sizes):
        raise BertraceError(f"{path}: changed while being read; rerun the examples stage")


def _check_corpus(path: Path, split: str) -> int:
    if not path.is_file():
        raise BertraceError(f"{path}: {split} corpus not found; run the clean stage first (dvc repro clean)")
    n = _count_documents(path)
    if n == 0:
        raise BertraceError(f"{path}: the {split} corpus has no documents; check the clean stage's min_chars")
    if n < 2:
        raise BertraceError(
            f"{path}: the {split} corpus has only 1 document, but NSP needs negatives from a different "
            "document; give the clean stage more text (or a lower min_chars / larger valid_fraction)")
    return n


def _remove_stale(out_dir: Path):
    (out_dir / "manifest.json").unlink(missing_ok=True)
    for split in SPLIT_IDS:
        d = out_dir / split
        if d.is_dir():
            for f in chain(d.glob("shard-*.parquet"), d.glob(".shard-*.tmp")):
                f.unlink()


# ----------------------------------------------------------------------------- driver


def generate_examples(
    train_txt: str | os.PathLike,
    valid_txt: str | os.PathLike,
    tokenizer_json: str | os.PathLike,
    out_dir: str | os.PathLike,
    cfg: ExamplesConfig,
    *,
    workers: int = 0,
    progress: bool = True,
) -> dict:
    """Write train/valid Parquet shards and ``manifest.json`` (SPEC "Examples shards").

    ``workers=0`` uses ``os.cpu_count()`` processes, ``workers=1`` runs in this process
    (never more processes than partitions). The pool uses the "spawn" start method, so a
    script calling this with ``workers != 1`` needs an ``if __name__ == "__main__":`` guard.
    The output bytes do not depend on ``workers``. Returns the manifest.
    """
    train_txt, valid_txt, tokenizer_json, out_dir = map(Path, (train_txt, valid_txt, tokenizer_json, out_dir))
    if not isinstance(cfg, ExamplesConfig):
        raise TypeError("cfg must be an ExamplesConfig")
    if workers < 0:
        raise BertraceError(f"examples workers = {workers}: must be >= 0 (0 = all cores); fix params.yaml")
    workers = workers or os.cpu_count() or 1

    tok = load_tokenizer(tokenizer_json)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    inputs = {"train.txt": train_txt, "valid.txt": valid_txt}
    num_docs = {split: _check_corpus(path, split) for split, path in zip(SPLIT_IDS, inputs.values())}
    dupes = {"train": cfg.dupe_factor, "valid": cfg.valid_dupe_factor}
    sizes = {split: partition_sizes(num_docs[split], cfg.docs_per_shard) for split in SPLIT_IDS}

    # Parallelism is per partition: more processes than partitions would only cost start-up.
    workers = min(workers, sum(len(v) for v in sizes.values()))

    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale(out_dir)
    tasks = ((split, p, docs, dupes[split])
             for split, path in zip(SPLIT_IDS, inputs.values())
             for p, docs in enumerate(_read_partitions(path, sizes[split])))

    results: list[dict] = []
    bar = tqdm(total=sum(num_docs.values()), unit="doc", desc="examples", disable=not progress)

    def collect(split: str, n_docs: int, stats: list[dict]):
        results.extend(dict(s, split=split) for s in stats)
        bar.update(n_docs)

    try:
        if workers == 1:
            worker = _Worker(str(tokenizer_json), cfg, str(out_dir))
            for split, p, docs, n in tasks:
                collect(split, len(docs), worker.process(split, p, docs, n))
        else:
            ctx = mp.get_context("spawn")
            with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_pool_worker,
                                        initargs=(str(tokenizer_json), cfg, str(out_dir))) as pool:
                pending: dict[cf.Future, tuple[str, int]] = {}
                try:
                    for split, p, docs, n in tasks:
                        while len(pending) >= 2 * workers:  # bounded: never read far ahead
                            done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                            for fut in done:
                                collect(*pending.pop(fut), fut.result())
                        pending[pool.submit(_pool_task, split, p, docs, n)] = (split, len(docs))
                    for fut in cf.as_completed(list(pending)):
                        collect(*pending.pop(fut), fut.result())
                except cf.process.BrokenProcessPool:
                    raise BertraceError(
                        "examples: a worker process died (out of memory? or a script that calls "
                        "generate_examples without an `if __name__ == '__main__':` guard, which the "
                        "'spawn' start method needs); rerun with examples.workers: 1 to see the cause") from None
                except BaseException:
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
    finally:
        bar.close()

    splits = {}
    for split in SPLIT_IDS:
        shards = sorted((r for r in results if r["split"] == split), key=lambda r: r["index"])
        rows = sum(s["rows"] for s in shards)
        tokens = sum(s["tokens"] for s in shards)
        if rows == 0:
            raise BertraceError(
                f"{inputs[split + '.txt']}: produced no {split} examples (its documents tokenize to nothing "
                "usable); check the clean stage's output and the tokenizer")
        entry = {
            "rows": rows, "tokens": tokens, "documents": num_docs[split],
            "nsp_random_fraction": sum(s["random_next"] for s in shards) / max(rows, 1),
            "shards": [{k: s[k] for k in ("path", "rows", "tokens", "sha256")} for s in shards],
        }
        if cfg.masking == "static":
            entry["masked_fraction"] = sum(s["masked"] for s in shards) / max(tokens, 1)
        splits[split] = entry

    tokenizer_sha = sha256_file(tokenizer_json)
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "masking": cfg.masking,
        "tokenizer_sha256": tokenizer_sha,
        "vocab_size": vocab_size,
        "special_ids": dict(SPECIAL_IDS),
        "max_seq_len": cfg.max_seq_len,
        "masked_lm_prob": cfg.masked_lm_prob,
        "max_predictions_per_seq": cfg.max_predictions_per_seq,
        "whole_word_masking": cfg.whole_word_masking,
        "seed": cfg.seed,
        "params": asdict(cfg),
        "inputs": {"train.txt": sha256_file(train_txt), "valid.txt": sha256_file(valid_txt),
                   "tokenizer.json": tokenizer_sha},
        "splits": splits,
    }
    write_json(out_dir / "manifest.json", manifest)
    return manifest
