"""Packed causal-LM examples (``examples.mode: causal``, pipeline/data/packing.py), their loader batches and
their Great Expectations suite (pipeline/checks/validate_packed.py)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checks.validate_shards import validate_shards
from pipeline.core.errors import BertraceError
from pipeline.core.formats import PAD_ID, SEP_ID
from pipeline.core.io import sha256_file
from pipeline.data.examples import ExamplesConfig, generate_examples
from pipeline.data.packing import pack_documents, unigram_cross_entropy
from pipeline.core.formats import UNIGRAM_COUNTS
from pipeline.data.shards import document_order, partition_sizes
from pipeline.pretrain.data import PretrainingData

BLOCK = 64
CFG = ExamplesConfig(mode="causal", max_seq_len=BLOCK, docs_per_shard=16, row_group_size=8, seed=3)


def _run(corpus, out: Path, cfg: ExamplesConfig = CFG, workers: int = 1) -> dict:  # noqa: F811
    return generate_examples(
        corpus["train"], corpus["valid"], corpus["tokenizer"], out, cfg, workers=workers, progress=False
    )


@pytest.fixture(scope="module")
def packed(corpus, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("packed")
    return out, _run(corpus, out)


def _blocks(out: Path, entry: dict) -> np.ndarray:
    col = pq.read_table(out / entry["path"]).column("input_ids").combine_chunks()
    return col.values.to_numpy().reshape(len(col), -1)


def test_blocks_are_the_documents_stream_cut_into_max_seq_len(packed, corpus):  # noqa: F811
    """Shard p holds partition p's documents (the MLM examples' seeded order and partitions), each
    followed by [SEP], cut into blocks of exactly max_seq_len; the tail is dropped and counted."""
    from tokenizers import Tokenizer

    out, manifest = packed
    tok = Tokenizer.from_file(str(corpus["tokenizer"]))
    assert manifest["mode"] == "causal" and manifest["separator_id"] == SEP_ID and manifest["tail"] == "dropped"
    for split in ("train", "valid"):
        lines = corpus[split].read_text(encoding="utf-8").splitlines()
        order = document_order(len(lines), CFG.seed, split, True)
        sizes = partition_sizes(len(lines), CFG.docs_per_shard)
        info = manifest["splits"][split]
        shards = {e["path"]: e for e in info["shards"]}
        lo, dropped, stream_tokens, text_bytes = 0, 0, 0, 0
        for p, size in enumerate(sizes):
            docs = [lines[i] for i in order[lo : lo + size]]
            lo += size
            stream = [t for d in docs for t in tok.encode(d, add_special_tokens=False).ids + [SEP_ID]]
            n = len(stream) // BLOCK
            dropped += len(stream) - n * BLOCK
            stream_tokens += len(stream)
            text_bytes += sum(len(d.encode("utf-8")) + 1 for d in docs)
            entry = shards.get(f"{split}/shard-{p:05d}.parquet")
            if n == 0:
                assert entry is None
                continue
            blocks = _blocks(out, entry)
            assert blocks.shape == (n, BLOCK) and entry["rows"] == n
            assert blocks.ravel().tolist() == stream[: n * BLOCK]
        assert info["dropped_tokens"] == dropped and 0 < dropped < BLOCK * len(sizes)
        assert info["stream_tokens"] == stream_tokens and info["tokens"] == info["rows"] * BLOCK
        assert info["text_bytes"] == text_bytes
        assert info["bytes_per_token"] == pytest.approx(text_bytes / stream_tokens)
        assert info["separators"] == sum(int((_blocks(out, e) == SEP_ID).sum()) for e in info["shards"])


def test_workers_do_not_change_output_bytes(packed, corpus, tmp_path):  # noqa: F811
    out, manifest = packed
    other = _run(corpus, tmp_path / "w2", workers=2)
    assert other == manifest
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    other_files = sorted(p.relative_to(tmp_path / "w2").as_posix() for p in (tmp_path / "w2").rglob("*") if p.is_file())
    assert files == other_files
    assert all(sha256_file(out / f) == sha256_file(tmp_path / "w2" / f) for f in files)


def test_pack_documents_separators_and_empty_documents(corpus):  # noqa: F811
    """A document that tokenizes to nothing gets no separator: two [SEP] are never adjacent."""
    from tokenizers import Tokenizer

    from pipeline.data.encode import SentenceEncoder

    tok = Tokenizer.from_file(str(corpus["tokenizer"]))
    enc = SentenceEncoder(tok, np.uint16)
    a, b = (tok.encode(w, add_special_tokens=False).ids for w in ("hello world foo", "bar"))
    blocks, stats = pack_documents(["hello world foo", "", "bar"], enc, 2)
    stream = a + [SEP_ID] + b + [SEP_ID]
    assert blocks.ravel().tolist() == stream[: len(stream) // 2 * 2] and blocks.shape[1] == 2
    assert stats == {
        "documents": 2,
        "stream_tokens": len(stream),
        "dropped_tokens": len(stream) % 2,
        "text_bytes": len("hello world foo") + 1 + len("bar") + 1,
    }
    assert not (blocks.ravel()[1:] == SEP_ID)[(blocks.ravel()[:-1] == SEP_ID)].any()


def test_unigram_baseline_and_bits_per_byte_in_the_manifest(packed):
    out, manifest = packed
    counts = np.load(out / UNIGRAM_COUNTS)
    assert sha256_file(out / UNIGRAM_COUNTS) == manifest["unigram"]["sha256"]
    assert counts.sum() == manifest["splits"]["train"]["tokens"] and len(counts) == manifest["vocab_size"]
    valid = np.concatenate([_blocks(out, e).ravel() for e in manifest["splits"]["valid"]["shards"]])
    p = (counts + 1) / (counts.sum() + len(counts))
    expected = -np.log(p[valid]).mean()
    assert manifest["unigram"]["valid_nats_per_token"] == pytest.approx(expected, rel=1e-12)
    assert unigram_cross_entropy(counts, np.bincount(valid, minlength=len(counts))) == pytest.approx(expected)
    bpt = manifest["splits"]["valid"]["bytes_per_token"]
    assert manifest["unigram"]["valid_bits_per_byte"] == pytest.approx(expected / math.log(2) / bpt)


def test_too_little_text_for_one_block_names_the_params(corpus, tmp_path):  # noqa: F811
    cfg = ExamplesConfig(**{**CFG.model_dump(), "max_seq_len": 60000})
    with pytest.raises(BertraceError, match=r"no train blocks.*examples\.max_seq_len"):
        _run(corpus, tmp_path / "big", cfg)


def test_loader_batches_are_full_blocks_with_an_all_ones_mask(packed):
    out, manifest = packed
    data = PretrainingData(out, "train", batch_size=4, seed=0, shuffle_buffer=16)
    assert data.rows == manifest["splits"]["train"]["rows"]
    batch = next(data.epoch_batches(0))
    assert tuple(batch.input_ids.shape) == (4, BLOCK) and batch.attention_mask.min() == 1 and not batch.padded
    assert batch.masked_positions.numel() == 0 and batch.next_sentence_labels.numel() == 0
    blocks = np.concatenate([_blocks(out, e) for e in manifest["splits"]["train"]["shards"]])
    assert batch.input_ids.tolist() == blocks[batch.example_ids.numpy()].tolist()  # row x of the split
    epoch = list(data.epoch_batches(0))
    seen = [x for b in epoch for x in b.example_ids.tolist()]
    assert len(seen) == len(set(seen)) == data.rows // 4 * 4  # every block at most once per epoch
    valid = PretrainingData(out, "valid", batch_size=4)
    v0 = _blocks(out, manifest["splits"]["valid"]["shards"][0])
    assert next(valid.eval_batches()).input_ids[0].tolist() == v0[0].tolist()  # file order
    resumed = list(data.epoch_batches(0, skip_batches=2))
    assert [b.example_ids.tolist() for b in resumed] == [b.example_ids.tolist() for b in epoch[2:]]


# ----------------------------------------------------------------------------- Great Expectations


def _copy(packed, tmp_path) -> tuple[Path, dict]:
    out, manifest = packed
    dest = tmp_path / "ex"
    shutil.copytree(out, dest)
    return dest, manifest


def _rewrite(path: Path, change) -> None:
    col = pq.read_table(path).column("input_ids").combine_chunks()
    rows = change([list(r) for r in col.values.to_numpy().reshape(len(col), -1).tolist()])
    pq.write_table(pa.table({"input_ids": pa.array(rows, type=col.type)}), path)


def _failed(report) -> set[str]:
    return {r.expectation for r in report.failures}


def test_gx_suite_passes_on_good_shards(packed):
    out, manifest = packed
    report = validate_shards(out)
    assert report.success, report.format_text()
    names = {r.expectation for r in report.results}
    assert {
        "expect_column_values_to_be_in_set(length)",
        "expect_column_values_to_be_between(max_token_id)",
        "expect_column_values_to_be_in_set(adjacent_separators)",
        "expect_column_values_to_be_in_set(pad_count)",
        "expect_column_sum_to_be_between(separators)",
        "expect_column_values_to_be_unique(block_hash across shards)",
    } <= names
    assert report.gx_results  # real GX suite results (for the Data Docs site)


@pytest.mark.parametrize(
    "corruption, check",
    [
        (lambda rows: [r[:-1] for r in rows], "expect_column_values_to_be_in_set(length)"),
        (
            lambda rows: [rows[0][:5] + [60000] + rows[0][6:]] + rows[1:],
            "expect_column_values_to_be_between(max_token_id)",
        ),
        (
            lambda rows: [[SEP_ID, SEP_ID] + rows[0][2:]] + rows[1:],
            "expect_column_values_to_be_in_set(adjacent_separators)",
        ),
        (lambda rows: [rows[0][:-3] + [PAD_ID] * 3] + rows[1:], "expect_column_values_to_be_in_set(pad_count)"),
    ],
)
def test_gx_suite_fails_on_corrupted_shards_naming_the_check(packed, tmp_path, corruption, check):
    dest, manifest = _copy(packed, tmp_path)
    shard = dest / manifest["splits"]["train"]["shards"][0]["path"]
    _rewrite(shard, corruption)
    report = validate_shards(dest)
    assert not report.success
    bad = [r for r in report.failures if r.expectation == check]
    assert bad and bad[0].target == str(shard) and bad[0].sample_rows[0]["row"] == 0, report.format_text()
    assert "sha256_matches_manifest" in _failed(report)


def test_gx_suite_finds_a_block_in_two_shards(packed, tmp_path):
    """A train block copied over a valid one: the cross-shard uniqueness check names both shards."""
    dest, manifest = _copy(packed, tmp_path)
    train = dest / manifest["splits"]["train"]["shards"][0]["path"]
    valid = dest / manifest["splits"]["valid"]["shards"][0]["path"]
    block = pq.read_table(train).column("input_ids")[0].as_py()
    _rewrite(valid, lambda rows: [block] + rows[1:])
    report = validate_shards(dest)
    (dup,) = [r for r in report.failures if r.expectation.startswith("expect_column_values_to_be_unique")]
    assert dup.unexpected_count == 2 and {s["shard"] for s in dup.sample_rows} == {str(train), str(valid)}
    assert "2 blocks occur more than once" in dup.message


def test_gx_split_totals_catch_a_lost_separator(packed, tmp_path):
    dest, manifest = _copy(packed, tmp_path)
    shard = dest / manifest["splits"]["valid"]["shards"][0]["path"]

    def drop_one_sep(rows):
        for r in rows:
            if SEP_ID in r:
                r[r.index(SEP_ID)] = 10
                return rows
        raise AssertionError("no separator")

    _rewrite(shard, drop_one_sep)
    report = validate_shards(dest)
    assert "expect_column_sum_to_be_between(separators)" in _failed(report)
