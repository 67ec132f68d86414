"""MLM/NSP example generation: sentence splitting, Google's recipe, shards, manifest, errors.

The corpus fixture gives every document its own vocabulary (disjoint word sets, each word a
single WordPiece token), so the document a token came from is known exactly.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.data.examples import ExamplesConfig, generate_examples, truncate_pair, truncation_amounts
from pipeline.core.formats import SPECIAL_IDS
from pipeline.data.sentences import split_sentences
from pipeline.data.shards import document_order, id_dtype, partition_sizes

CLS, SEP, MASK, UNK = SPECIAL_IDS["[CLS]"], SPECIAL_IDS["[SEP]"], SPECIAL_IDS["[MASK]"], SPECIAL_IDS["[UNK]"]
MAX_LEN = 64


def replace(cfg: ExamplesConfig, **changes) -> ExamplesConfig:
    """``dataclasses.replace`` for the (pydantic) config: a new, validated one."""
    return ExamplesConfig(**{**cfg.model_dump(), **changes})


# ----------------------------------------------------------------------------- sentences


def test_split_sentences_english_abbreviations_initials_decimals():
    text = (
        "Mr. Smith met Dr. Jones at St. Paul's. J. R. R. Tolkien wrote it in 1937! It cost 3.5 "
        "dollars, i.e. cheap, e.g. less than lunch etc. and tea vs. coffee. Room No. 5 is in the "
        'U.S. now? Yes. "Stop." He left.'
    )
    assert split_sentences(text) == [
        "Mr. Smith met Dr. Jones at St. Paul's.",
        "J. R. R. Tolkien wrote it in 1937!",
        "It cost 3.5 dollars, i.e. cheap, e.g. less than lunch etc. and tea vs. coffee.",
        "Room No. 5 is in the U.S. now?",
        "Yes.",
        '"Stop."',
        "He left.",
    ]
    # WikiText style: spaces before the stop; lower-cased text still splits
    assert split_sentences("he is an actor . he had a role . ") == ["he is an actor .", "he had a role ."]
    assert split_sentences("  ") == []


def test_split_sentences_bengali_hindi_arabic_urdu():
    assert split_sentences("আমি ভাত খাই। তুমি কি খাও? সে জল খায়।") == ["আমি ভাত খাই।", "তুমি কি খাও?", "সে জল খায়।"]
    assert split_sentences("मैं घर जाता हूँ।वह स्कूल जाती है॥ ठीक") == ["मैं घर जाता हूँ।", "वह स्कूल जाती है॥", "ठीक"]
    assert split_sentences("ما اسمك؟ اسمي علي.") == ["ما اسمك؟", "اسمي علي."]
    assert split_sentences("یہ کتاب ہے۔ وہ قلم ہے۔") == ["یہ کتاب ہے۔", "وہ قلم ہے۔"]


def test_split_sentences_cjk_needs_no_space():
    assert split_sentences("我爱你。你好吗？很好！「走吧。」他说。") == [
        "我爱你。",
        "你好吗？",
        "很好！",
        "「走吧。」",
        "他说。",
    ]
    assert split_sentences("東京に行きました。楽しかった") == ["東京に行きました。", "楽しかった"]


# ----------------------------------------------------------------------------- helpers


def truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    """Google's ``truncate_seq_pair``, verbatim: create_pretraining_data.py l. 418-433 of
    google-research/bert@eedf5716ce1268e56f0a50264a88cafad334ac61 (master). Note l. 425: B
    is trimmed when A and B are equally long."""
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break

        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1

        # We want to sometimes truncate from the front and sometimes from the
        # back to add more randomness and avoid biases.
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def _google(la: int, lb: int, max_num: int, rng: random.Random) -> tuple[int, int, int, int]:
    """Google's truncation of A = 0..la-1, B = la..la+lb-1 as ``(a_lo, a_hi, b_lo, b_hi)``."""
    a, b = list(range(la)), list(range(la, la + lb))
    truncate_seq_pair(a, b, max_num, rng)
    assert a == list(range(a[0], a[-1] + 1)) and b == list(range(b[0], b[-1] + 1))  # contiguous
    return a[0], a[-1] + 1, b[0], b[-1] + 1


@pytest.mark.parametrize("max_num", [5, 13, 61, 125])
def test_truncation_matches_googles_truncate_seq_pair_on_all_length_pairs(max_num):
    """Every (len_a, len_b) with both up to the max (and beyond it for the small maxima): the same
    number of tokens leaves each side, and a valid span remains (Google's asserts hold)."""
    rng, ours_rng = random.Random(0), random.Random(1)
    top = max_num if max_num > 61 else 2 * max_num + 2
    for la in range(1, top + 1):
        for lb in range(1, top + 1):
            a_lo, a_hi, b_lo, b_hi = _google(la, lb, max_num, rng)
            want = (la - (a_hi - a_lo), lb - (b_hi - b_lo))
            assert truncation_amounts(la, lb, max_num) == want, (la, lb, max_num)
            o_lo, o_hi, p_lo, p_hi = truncate_pair(0, la, la, la + lb, max_num, ours_rng)
            assert (o_hi - o_lo, p_hi - p_lo) == (a_hi - a_lo, b_hi - b_lo)
            assert 0 <= o_lo < o_hi <= la <= p_lo < p_hi <= la + lb
    if max_num == 125:  # the case: a pair trimmed on both sides ends 63/62 (A/B)
        assert truncation_amounts(100, 100, 125) == (37, 38)
        assert truncation_amounts(64, 63, 125) == (1, 1)


@pytest.mark.parametrize("la, lb", [(70, 90), (100, 100), (126, 3)])
def test_truncation_front_back_split_has_googles_distribution(la, lb):
    """Google pops each token from the front or the back with p = 0.5 (l. 430-433); we draw the
    split as Binomial(cut, 0.5). Same mean and variance of tokens taken from each front."""
    n, max_num = 4000, 125
    g_rng, o_rng = random.Random(2), random.Random(3)
    google = np.array([_google(la, lb, max_num, g_rng) for _ in range(n)])
    ours = np.array([truncate_pair(0, la, la, la + lb, max_num, o_rng) for _ in range(n)])
    for col, start in ((0, 0), (2, la)):  # tokens cut from the front of A, of B
        g, o = google[:, col] - start, ours[:, col] - start
        cut = truncation_amounts(la, lb, max_num)[col // 2]
        assert (google[:, col + 1] - google[:, col] == ours[:, col + 1] - ours[:, col]).all()
        if cut == 0:
            assert (g == 0).all() and (o == 0).all()
            continue
        sd = (cut / 4) ** 0.5
        assert abs(g.mean() - cut / 2) < 5 * sd / n**0.5 and abs(o.mean() - cut / 2) < 5 * sd / n**0.5
        assert 0.85 < o.var() / g.var() < 1.15


def test_pairing_tiles_each_document_with_put_back():
    """One-token sentences and max_seq_len 8 (target 5 tokens) make truncation impossible, so
    the own-document spans (every A, and B when IsNext) must tile each document exactly: the
    unused sentences of a NotNext chunk are put back (Google's ``i -= num_unused_segments``)."""
    from pipeline.data.examples import _pairs_for_document, _Partition

    part = _Partition.__new__(_Partition)
    part.doc_n = [23, 7, 40, 1, 12]
    part.doc_first = np.r_[0, np.cumsum(part.doc_n)[:-1]].tolist()
    part.off = list(range(sum(part.doc_n) + 1))  # sentence j is token j
    cfg = ExamplesConfig.model_construct(max_seq_len=8, short_seq_prob=0.0)  # below the bound, for the tiling
    rng = random.Random(0)
    for _ in range(20):
        for d in range(len(part.doc_n)):
            pairs: list = []
            _pairs_for_document(part, d, cfg, rng, pairs)
            lo, hi = part.doc_first[d], part.doc_first[d] + part.doc_n[d]
            spans = sorted(
                [(a_lo, a_hi) for a_lo, a_hi, *_ in pairs]
                + [(b_lo, b_hi) for _, _, b_lo, b_hi, rnd in pairs if not rnd]
            )
            assert spans[0][0] == lo and spans[-1][1] == hi
            assert all(x[1] == y[0] for x, y in zip(spans, spans[1:])), spans
            for a_lo, a_hi, b_lo, b_hi, rnd in pairs:
                assert 1 <= a_hi - a_lo and 1 <= b_hi - b_lo and (a_hi - a_lo) + (b_hi - b_lo) <= 5
                assert rnd == (not lo <= b_lo < hi)


def test_id_dtype_and_schema_follow_vocab_size():
    from pipeline.data.examples import shard_schema

    assert id_dtype(65536) == np.uint16 and id_dtype(65537) == np.uint32
    schema = shard_schema(np.uint32, "static")
    assert schema.field("input_ids").type == pa.list_(pa.uint32())
    assert schema.field("masked_lm_ids").type == pa.list_(pa.uint32())
    assert schema.field("masked_lm_positions").type == pa.list_(pa.uint16())
    assert shard_schema(np.uint16, "dynamic").names == ["input_ids", "token_type_ids", "next_sentence_label"]


def test_partition_sizes_merge_a_trailing_single_document():
    assert partition_sizes(17, 8) == [8, 9]
    assert partition_sizes(18, 8) == [8, 8, 2]
    assert partition_sizes(16, 8) == [8, 8]
    assert partition_sizes(3, 8) == [3]


# ----------------------------------------------------------------------------- fixtures






CFG = ExamplesConfig(
    max_seq_len=MAX_LEN, max_predictions_per_seq=20, dupe_factor=5, valid_dupe_factor=2, docs_per_shard=16, seed=3
)


def _run(corpus, out: Path, cfg: ExamplesConfig = CFG, workers: int = 1) -> dict:
    return generate_examples(
        corpus["train"], corpus["valid"], corpus["tokenizer"], out, cfg, workers=workers, progress=False
    )


def _read(out: Path, manifest: dict, split: str) -> pa.Table:
    return pa.concat_tables([pq.read_table(out / s["path"]) for s in manifest["splits"][split]["shards"]])


@pytest.fixture(scope="module")
def static_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("static")
    return out, _run(corpus, out)


@pytest.fixture(scope="module")
def dynamic_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("dynamic")
    return out, _run(corpus, out, replace(CFG, masking="dynamic"))


# ----------------------------------------------------------------------------- layout


def test_rows_are_cls_a_sep_b_sep_with_segment_ids(static_run):
    out, manifest = static_run
    for split in ("train", "valid"):
        table = _read(out, manifest, split)
        assert table.schema.field("input_ids").type == pa.list_(pa.uint16())
        assert table.schema.field("token_type_ids").type == pa.list_(pa.uint8())
        assert table.schema.field("next_sentence_label").type == pa.int8()
        assert table.schema.field("masked_lm_positions").type == pa.list_(pa.uint16())
        assert table.schema.field("masked_lm_ids").type == pa.list_(pa.uint16())
        assert table.num_rows > 50
        for ids, types in zip(table["input_ids"].to_pylist(), table["token_type_ids"].to_pylist()):
            ids, types = np.array(ids), np.array(types)
            assert len(ids) <= MAX_LEN and len(ids) == len(types)
            seps = np.flatnonzero(ids == SEP)
            assert ids[0] == CLS and (ids[1:] != CLS).all()
            assert len(seps) == 2 and seps[1] == len(ids) - 1 and 2 <= seps[0] <= len(ids) - 3  # A, B non-empty
            assert (types[: seps[0] + 1] == 0).all() and (types[seps[0] + 1 :] == 1).all()


def test_short_seq_prob_controls_lengths(corpus, tmp_path):
    long = _read(tmp_path / "a", _run(corpus, tmp_path / "a", replace(CFG, short_seq_prob=0.0, dupe_factor=1)), "train")
    short = _read(
        tmp_path / "b", _run(corpus, tmp_path / "b", replace(CFG, short_seq_prob=1.0, dupe_factor=1)), "train"
    )
    mean_len = lambda t: np.mean([len(x) for x in t["input_ids"].to_pylist()])  # noqa: E731
    assert mean_len(long) > 0.8 * MAX_LEN
    assert mean_len(short) < 0.7 * MAX_LEN


# ----------------------------------------------------------------------------- NSP


def test_nsp_balance_and_b_segment_documents(dynamic_run, corpus):
    out, manifest = dynamic_run
    doc_of = corpus["doc_of"]
    for split in ("train", "valid"):
        table = _read(out, manifest, split)
        labels = table["next_sentence_label"].to_numpy()
        assert set(np.unique(labels)) <= {0, 1}
        frac = labels.mean()
        # ~0.55 (a one-sentence chunk always gets a random B); rows of a document are correlated,
        # so allow 4 binomial standard deviations (the valid split has < 100 rows)
        assert abs(frac - 0.55) <= max(0.07, 4 * (0.25 / len(labels)) ** 0.5), (split, frac, len(labels))
        assert manifest["splits"][split]["nsp_random_fraction"] == pytest.approx(frac)
        for ids, label in zip(table["input_ids"].to_pylist(), labels):
            ids = np.array(ids)
            sep = np.flatnonzero(ids == SEP)[0]
            docs_a = set(doc_of[ids[1:sep]]) - {-1}
            docs_b = set(doc_of[ids[sep + 1 : -1]]) - {-1}
            assert len(docs_a) == 1 and len(docs_b) == 1, "a segment spans two documents"
            if label == 1:
                assert docs_a != docs_b, "NotNext B comes from A's own document"
            else:
                assert docs_a == docs_b, "IsNext B comes from another document"


# ----------------------------------------------------------------------------- masking


def test_static_masking_statistics(static_run, corpus):
    out, manifest = static_run
    table = _read(out, manifest, "train")
    n_tokens = n_masked = n_mask = n_same = n_random = 0
    for ids, pos, lab in zip(
        table["input_ids"].to_pylist(), table["masked_lm_positions"].to_pylist(), table["masked_lm_ids"].to_pylist()
    ):
        ids, pos, lab = np.array(ids), np.array(pos), np.array(lab)
        assert len(pos) == len(lab) == min(20, max(1, round(len(ids) * 0.15)))
        assert (np.diff(pos) > 0).all() and pos.min() > 0 and pos.max() < len(ids) - 1
        assert not np.isin(lab, [CLS, SEP]).any()
        got = ids[pos]
        n_tokens += len(ids)
        n_masked += len(pos)
        n_mask += int((got == MASK).sum())
        n_same += int((got == lab).sum())
        n_random += int(((got != MASK) & (got != lab)).sum())
        assert (got < corpus["vocab_size"]).all()
    assert n_masked > 5000
    assert n_masked / n_tokens == pytest.approx(0.15, abs=0.01)
    assert manifest["splits"]["train"]["masked_fraction"] == pytest.approx(n_masked / n_tokens)
    assert n_mask / n_masked == pytest.approx(0.8, abs=0.02)
    assert n_same / n_masked == pytest.approx(0.1, abs=0.02)
    assert n_random / n_masked == pytest.approx(0.1, abs=0.02)


def test_max_predictions_per_seq_caps_masks(corpus, tmp_path):
    cfg = replace(CFG, max_predictions_per_seq=3, dupe_factor=1, short_seq_prob=0.0)
    manifest = _run(corpus, tmp_path, cfg)
    table = _read(tmp_path, manifest, "train")
    counts = np.array([len(p) for p in table["masked_lm_positions"].to_pylist()])
    lengths = np.array([len(x) for x in table["input_ids"].to_pylist()])
    assert counts.max() == 3
    assert (counts[lengths >= 24] == 3).all()


def test_dynamic_mode_stores_the_same_pairs_unmasked(static_run, dynamic_run):
    (s_out, s_man), (d_out, d_man) = static_run, dynamic_run
    assert d_man["masking"] == "dynamic" and "masked_fraction" not in d_man["splits"]["train"]
    for split in ("train", "valid"):
        static, dynamic = _read(s_out, s_man, split), _read(d_out, d_man, split)
        assert dynamic.column_names == ["input_ids", "token_type_ids", "next_sentence_label"]
        assert dynamic["token_type_ids"].equals(static["token_type_ids"])
        assert dynamic["next_sentence_label"].equals(static["next_sentence_label"])
        d_ids = dynamic["input_ids"].to_pylist()
        assert not any(MASK in ids for ids in d_ids)
        for s_ids, pos, lab, ids in zip(
            static["input_ids"].to_pylist(),
            static["masked_lm_positions"].to_pylist(),
            static["masked_lm_ids"].to_pylist(),
            d_ids,
        ):
            restored = np.array(s_ids)
            restored[pos] = lab
            assert restored.tolist() == ids


def test_whole_word_masking_runs(corpus, tmp_path):
    manifest = _run(corpus, tmp_path, replace(CFG, whole_word_masking=True, dupe_factor=1))
    assert manifest["whole_word_masking"] is True
    assert manifest["splits"]["train"]["masked_fraction"] == pytest.approx(0.15, abs=0.01)


def test_dynamic_masking_follows_the_manifest():
    """The loader builds its MaskingSpec from the manifest; a manifest without the key (written
    before mask_candidates existed) keeps the old candidate set."""
    from pipeline.pretrain.data import masking_spec

    manifest = {"vocab_size": 100, "masked_lm_prob": 0.15, "max_predictions_per_seq": 20}
    assert masking_spec(manifest).skipped_ids == tuple(SPECIAL_IDS.values())
    assert masking_spec({**manifest, "mask_candidates": "skip_special"}).skipped_ids == tuple(SPECIAL_IDS.values())
    assert masking_spec({**manifest, "mask_candidates": "google"}).skipped_ids == (CLS, SEP)
    with pytest.raises(BertraceError, match="mask_candidates 'all' is not one of google, skip_special"):
        masking_spec({**manifest, "mask_candidates": "all"})


# ----------------------------------------------------------------------------- shards, manifest


def test_workers_do_not_change_output_bytes(corpus, static_run, tmp_path):
    out1, man1 = static_run
    man2 = _run(corpus, tmp_path, workers=2)
    assert man1 == man2
    assert (out1 / "manifest.json").read_bytes() == (tmp_path / "manifest.json").read_bytes()
    for split in ("train", "valid"):
        for shard in man2["splits"][split]["shards"]:
            assert sha256_file(tmp_path / shard["path"]) == sha256_file(out1 / shard["path"])


def test_manifest_content(static_run, corpus):
    out, manifest = static_run
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert manifest["schema_version"] == 1 and manifest["masking"] == "static"
    assert manifest["tokenizer_sha256"] == sha256_file(corpus["tokenizer"])
    assert manifest["inputs"] == {
        "train.txt": sha256_file(corpus["train"]),
        "valid.txt": sha256_file(corpus["valid"]),
        "tokenizer.json": sha256_file(corpus["tokenizer"]),
    }
    assert manifest["vocab_size"] == corpus["vocab_size"]
    assert manifest["special_ids"] == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    assert (manifest["max_seq_len"], manifest["seed"], manifest["max_predictions_per_seq"]) == (MAX_LEN, 3, 20)
    assert manifest["params"]["dupe_factor"] == 5
    assert manifest["params"] == CFG.recipe() and "workers" not in manifest["params"]
    assert (manifest["mask_candidates"], manifest["shuffle_documents"]) == ("google", True)
    # 60 train docs / 16 per shard -> 4 partitions x 5 dupes; 6 valid docs -> 1 partition x 2 dupes
    expect = {"train": (60, 20), "valid": (6, 2)}
    for split, entry in manifest["splits"].items():
        assert (entry["documents"], len(entry["shards"])) == expect[split]
        assert [s["path"] for s in entry["shards"]] == [
            f"{split}/shard-{i:05d}.parquet" for i in range(expect[split][1])
        ]
        assert sorted(p.name for p in (out / split).iterdir()) == [Path(s["path"]).name for s in entry["shards"]]
        assert entry["rows"] == sum(s["rows"] for s in entry["shards"])
        assert entry["tokens"] == sum(s["tokens"] for s in entry["shards"])
        for s in entry["shards"]:
            assert s["sha256"] == sha256_file(out / s["path"])
            table = pq.read_table(out / s["path"])
            assert table.num_rows == s["rows"]
            assert pa.compute.sum(pa.compute.list_value_length(table["input_ids"])).as_py() == s["tokens"]
            assert pq.ParquetFile(out / s["path"]).metadata.row_group(0).column(0).compression == "ZSTD"


def test_stale_shards_are_removed(corpus, tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "shard-00099.parquet").write_bytes(b"old")
    manifest = _run(corpus, tmp_path, replace(CFG, dupe_factor=1, docs_per_shard=64))
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == ["shard-00000.parquet"]
    assert manifest["splits"]["train"]["rows"] > 0


def _a_documents(table: pa.Table, doc_of: np.ndarray) -> list[int]:
    """The document of each row's segment A (fixture documents have disjoint vocabularies)."""
    out = []
    for ids in table["input_ids"].to_pylist():
        ids = np.array(ids)
        sep = np.flatnonzero(ids == SEP)[0]
        docs = set(doc_of[ids[1:sep]]) - {-1}
        assert len(docs) == 1
        out.append(docs.pop())
    return out


@pytest.mark.parametrize("shuffle", [True, False])
def test_shuffle_documents_partitions_a_seeded_permutation(corpus, tmp_path, shuffle):
    """Partition p holds the documents ``order[p*S:(p+1)*S]`` of :func:`document_order`: a seeded
    permutation (file order when off), each document in exactly one partition."""
    cfg = replace(CFG, dupe_factor=1, masking="dynamic", shuffle_documents=shuffle)
    manifest = _run(corpus, tmp_path, cfg)
    assert manifest["shuffle_documents"] is shuffle and manifest["params"]["shuffle_documents"] is shuffle
    order = document_order(60, CFG.seed, "train", shuffle)
    assert sorted(order.tolist()) == list(range(60))
    assert (order.tolist() == list(range(60))) is not shuffle
    for p, shard in enumerate(manifest["splits"]["train"]["shards"]):
        got = set(_a_documents(pq.read_table(tmp_path / shard["path"]), corpus["doc_of"]))
        assert got == set(order[p * 16 : (p + 1) * 16].tolist())
    # seeded by (seed, split) only
    assert (document_order(60, CFG.seed, "train", True) == document_order(60, CFG.seed, "train", True)).all()
    assert (document_order(60, CFG.seed, "train", True) != document_order(60, CFG.seed + 1, "train", True)).any()
    assert (document_order(60, CFG.seed, "train", True) != document_order(60, CFG.seed, "valid", True)).any()


def test_shuffled_output_bytes_do_not_depend_on_workers(corpus, tmp_path):
    cfg = replace(CFG, dupe_factor=1, docs_per_shard=7)
    one, two = _run(corpus, tmp_path / "1", cfg, workers=1), _run(corpus, tmp_path / "2", cfg, workers=2)
    assert one == two and len(one["splits"]["train"]["shards"]) == 9  # 60 documents: 8 x 7 + 4


def test_lone_document_draws_negatives_from_a_neighbouring_partition(corpus, tmp_path):
    """Partition [d2, an empty document] has one usable document: its NotNext B segments come
    from the reserve, the first documents of partition [d0, d1]; IsNext and NotNext both occur."""
    docs = [line for line in corpus["train"].read_text(encoding="utf-8").splitlines()[:3]]
    train = tmp_path / "train.txt"
    train.write_text("\n".join([*docs, "\u200b"]) + "\n", encoding="utf-8")  # tokenizes to nothing
    cfg = replace(CFG, docs_per_shard=2, shuffle_documents=False, dupe_factor=4, masking="dynamic")
    manifest = generate_examples(
        train, corpus["valid"], corpus["tokenizer"], tmp_path / "out", cfg, workers=1, progress=False
    )
    doc_of = corpus["doc_of"]
    shards = manifest["splits"]["train"]["shards"]
    assert len(shards) == 8
    table = pa.concat_tables([pq.read_table(tmp_path / "out" / s["path"]) for s in shards[4:]])  # partition 1
    labels = table["next_sentence_label"].to_numpy()
    assert set(_a_documents(table, doc_of)) == {2}
    assert 0.3 < labels.mean() < 0.8
    for ids, label in zip(table["input_ids"].to_pylist(), labels):
        ids = np.array(ids)
        sep = np.flatnonzero(ids == SEP)[0]
        b_docs = set(doc_of[ids[sep + 1 : -1]]) - {-1}
        assert len(b_docs) == 1 and (b_docs <= {0, 1} if label else b_docs == {2}), (label, b_docs)


# ----------------------------------------------------------------------------- errors


def test_error_empty_corpus(corpus, tmp_path):
    empty = tmp_path / "train.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(BertraceError, match=r"train\.txt.*has no documents; check the clean stage's min_chars"):
        generate_examples(empty, corpus["valid"], corpus["tokenizer"], tmp_path / "out", CFG, workers=1, progress=False)


def test_error_single_document(corpus, tmp_path):
    one = tmp_path / "valid.txt"
    one.write_text("just one document. with two sentences.\n", encoding="utf-8")
    with pytest.raises(BertraceError, match=r"valid\.txt.*NSP needs negatives from a different document"):
        generate_examples(corpus["train"], one, corpus["tokenizer"], tmp_path / "out", CFG, workers=1, progress=False)


def test_error_no_usable_examples(corpus, tmp_path):
    blank = tmp_path / "train.txt"
    blank.write_text("\u200b\nonly one usable sentence.\n", encoding="utf-8")  # first doc tokenizes to nothing
    with pytest.raises(BertraceError, match=r"train\.txt: produced no train examples"):
        generate_examples(
            blank,
            corpus["valid"],
            corpus["tokenizer"],
            tmp_path / "out",
            replace(CFG, masking="dynamic"),
            workers=1,
            progress=False,
        )


def test_error_missing_files(corpus, tmp_path):
    with pytest.raises(BertraceError, match=r"nope\.txt: train corpus not found; run the clean stage"):
        generate_examples(
            tmp_path / "nope.txt", corpus["valid"], corpus["tokenizer"], tmp_path / "o", CFG, progress=False
        )
    with pytest.raises(BertraceError, match=r"tok\.json: tokenizer not found; run the tokenizer stage"):
        generate_examples(corpus["train"], corpus["valid"], tmp_path / "tok.json", tmp_path / "o", CFG, progress=False)
    assert not (tmp_path / "o").exists()


def test_error_tokenizer_with_wrong_special_ids(corpus, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train(
        [str(corpus["valid"])],
        trainers.WordPieceTrainer(
            vocab_size=200, special_tokens=["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False
        ),
    )
    tok.save(str(tmp_path / "bad.json"))
    with pytest.raises(BertraceError, match=r"bad\.json: special tokens have ids \{'\[PAD\]': 1, '\[UNK\]': 0\}"):
        generate_examples(corpus["train"], corpus["valid"], tmp_path / "bad.json", tmp_path / "o", CFG, progress=False)


@pytest.mark.parametrize(
    "change, pattern",
    [
        ({"max_seq_len": 4}, r"examples\.max_seq_len = 4: must be >= 8"),
        (
            {"max_seq_len": 8},
            r"^params.yaml: examples\.max_seq_len = 8: too short for MLM/NSP examples; a pair of 5 WordPieces rarely "
            r"holds two sentences, so next-sentence prediction gets almost only random B's \(label 1\); use at least 32 "
            r"\(BERT: 128, then 512\), or examples\.mode: causal for short blocks$",
        ),
        ({"masking": "sometimes"}, r"examples\.masking = 'sometimes': input should be 'static' or 'dynamic'"),
        ({"mask_candidates": "all"}, r"examples\.mask_candidates = 'all': input should be 'google' or 'skip_special'"),
        ({"shuffle_documents": "yes"}, r"examples\.shuffle_documents = 'yes': must be true or false"),
        ({"seed": 2.5}, r"examples\.seed = 2\.5: must be an integer"),
        ({"masked_lm_prob": 1.5}, r"examples\.masked_lm_prob"),
        ({"dupe_factor": 0}, r"examples\.dupe_factor"),
        ({"docs_per_shard": 1}, r"examples\.docs_per_shard"),
    ],
)
def test_config_validation(change, pattern):
    with pytest.raises(BertraceError, match=pattern):
        ExamplesConfig(**change)


def test_short_blocks_are_fine_for_causal_examples():
    assert ExamplesConfig(mode="causal", max_seq_len=8).max_seq_len == 8
    assert ExamplesConfig(max_seq_len=32).max_seq_len == 32


def test_config_from_params():
    cfg = ExamplesConfig.from_params({"max_seq_len": 256, "workers": 4, "masking": "dynamic"})
    assert (cfg.max_seq_len, cfg.masking, cfg.workers) == (256, "dynamic", 4)
    assert "workers" not in cfg.recipe() and set(cfg.recipe()) == set(ExamplesConfig.recipe_keys())
    with pytest.raises(BertraceError, match=r"examples\.max_len: unknown key"):
        ExamplesConfig.from_params({"max_len": 256})


def test_config_defaults_equal_params_yaml():
    import yaml

    section = yaml.safe_load((Path(__file__).resolve().parents[3] / "params.yaml").read_text())["examples"]
    assert ExamplesConfig().model_dump() == ExamplesConfig.from_params(section).model_dump()
    assert set(section) == set(ExamplesConfig.model_fields)


# ----------------------------------------------------------------------------- fast encoding


TRICKY = [
    "Mr. Smith's [MASK] cost $3.50 (approx.)!",
    "[SEP]x y[CLS]z",
    "Café naïve ÜBER straße",
    "東京に行きました。",
    "x" * 101,
    "y" * 100,
    "tab\there",
    "ctrl\x01char",
    "two  spaces ",
    "",
    "ΑΣ Σ",
    "##ab ## #",
    "a\u200bb",
    "don't stop-believing!!",
    "U.S.A. 1,234.5 e-mail@x.org",
    "\u00a0nbsp",
]


@pytest.mark.parametrize("max_cache", [1 << 19, 5])
def test_sentence_encoder_gives_the_tokenizers_ids(corpus, max_cache):
    from pipeline.data.encode import SentenceEncoder
    from pipeline.data.tokenizer import load_tokenizer

    tok = load_tokenizer(corpus["tokenizer"])
    lines = corpus["train"].read_text(encoding="utf-8").splitlines()[:10]
    sentences = [s for line in lines for s in split_sentences(line)] + TRICKY + [s.upper() for s in TRICKY]
    enc = SentenceEncoder(tok, np.uint16, max_cache=max_cache)
    assert enc.chunked and enc.python_wordpiece
    for batch in (sentences[:50], sentences, sentences[::-1]):  # cold, partly warm, warm cache
        ids, lengths = enc.encode(batch)
        expect = [e.ids for e in tok.encode_batch(batch, add_special_tokens=False)]
        assert lengths.tolist() == [len(e) for e in expect]
        assert ids.tolist() == [i for e in expect for i in e]


def test_sentence_encoder_falls_back_for_other_tokenizers(corpus):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from pipeline.data.encode import SentenceEncoder

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()  # spaces are part of the tokens: no chunking
    tok.train(
        [str(corpus["valid"])],
        trainers.BpeTrainer(vocab_size=300, special_tokens=list(SPECIAL_IDS), show_progress=False),
    )
    enc = SentenceEncoder(tok, np.uint16)
    assert not enc.chunked
    ids, lengths = enc.encode(TRICKY)
    assert ids.tolist() == [i for e in tok.encode_batch(TRICKY, add_special_tokens=False) for i in e.ids]
