"""The pre-training loader: shard-aware shuffling, DDP split, dynamic masking, cheap resume.

Also home of ``make_examples``, a builder of tiny SPEC-conformant shard directories that the
other ``test_pretrain*`` files import.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipeline.core.errors import BertraceError
from pipeline.core.formats import SPLIT_IDS
from pipeline.data.masking import mask_rows
from pipeline.pretrain.data import PretrainingData, collate_examples, continuation_table, load_manifest
from tests.support.examples_data import (
    TOKENIZER_SHA,
    VOCAB,
    flip_first_label,
    make_examples,
    make_tokenizer,
    rewrite_shard,
    set_column,
    truncate,
)


@pytest.fixture(scope="module")
def static_dir(tmp_path_factory):
    return make_examples(tmp_path_factory.mktemp("static"), masking="static", frozen_masking=False)


@pytest.fixture(scope="module")
def dynamic_dir(tmp_path_factory):
    return make_examples(tmp_path_factory.mktemp("dynamic"), masking="dynamic")


def _epoch_ids(data: PretrainingData, epoch: int, skip: int = 0) -> list[list[int]]:
    return [b.example_ids.tolist() for b in data.epoch_batches(epoch, skip)]


def test_batch_shapes_padding_and_flat_positions(static_dir):
    data = PretrainingData(static_dir, batch_size=16, seed=0)
    batch = next(data.epoch_batches(0))
    B, T = batch.input_ids.shape
    assert B == 16 and batch.input_ids.dtype == torch.long
    lengths = batch.attention_mask.sum(1)
    assert T == int(lengths.max())  # padded to the longest sequence of this batch
    assert (batch.input_ids[batch.attention_mask == 0] == 0).all()
    assert batch.token_type_ids.shape == (B, T) and batch.next_sentence_labels.shape == (B,)
    N = batch.masked_positions.numel()
    assert batch.masked_lm_labels.shape == (N,) and N > 0
    # flat positions land on real tokens and point at the stored original ids' slots
    flat_mask = batch.attention_mask.reshape(-1)[batch.masked_positions]
    assert (flat_mask == 1).all()
    rows = batch.masked_positions // T
    assert rows.min() >= 0 and rows.max() < B
    # static shards: labels are the stored masked_lm_ids, and 80% of positions hold [MASK]
    assert (batch.masked_lm_labels >= 5).all()
    frac_mask = (batch.input_ids.reshape(-1)[batch.masked_positions] == 4).float().mean()
    assert 0.6 < float(frac_mask) < 0.95


def test_epoch_is_a_shuffled_permutation_and_differs_by_epoch(static_dir):
    data = PretrainingData(static_dir, batch_size=16, seed=0, shuffle_buffer=64)
    e0, e1 = _epoch_ids(data, 0), _epoch_ids(data, 1)
    flat0 = [x for b in e0 for x in b]
    assert len(e0) == data.batches_per_epoch(0) == 512 // 16
    assert sorted(flat0) == list(range(512))  # every row exactly once
    assert flat0 != sorted(flat0)
    assert e0 != e1
    # deterministic from the seed, different for another seed
    assert _epoch_ids(PretrainingData(static_dir, batch_size=16, seed=0, shuffle_buffer=64), 0) == e0
    assert _epoch_ids(PretrainingData(static_dir, batch_size=16, seed=1, shuffle_buffer=64), 0) != e0
    # the buffer mixes row groups: a batch spans several 32-row units
    units = {x // 32 for x in e0[5]}
    assert len(units) >= 2


def test_resume_skip_gives_the_same_remaining_batches(static_dir, dynamic_dir):
    for d in (static_dir, dynamic_dir):
        data = PretrainingData(d, batch_size=8, seed=3, shuffle_buffer=50)
        full = list(data.epoch_batches(2))
        for skip in (1, 7, 40, len(full) - 1, len(full)):
            rest = list(PretrainingData(d, batch_size=8, seed=3, shuffle_buffer=50).epoch_batches(2, skip))
            assert len(rest) == len(full) - skip
            for a, b in zip(full[skip:], rest):
                assert torch.equal(a.example_ids, b.example_ids)
                assert torch.equal(a.input_ids, b.input_ids)
                assert torch.equal(a.masked_positions, b.masked_positions)
    # the stream crosses epochs and picks up exactly where it left
    data = PretrainingData(static_dir, batch_size=8, seed=3)
    n = data.batches_per_epoch(0)
    it = data.train_stream(0, n - 2)
    got = [next(it)[:2] for _ in range(4)]
    assert got == [(0, n - 2), (0, n - 1), (1, 0), (1, 1)]


def test_skipping_reads_only_what_it_needs(static_dir, monkeypatch):
    data = PretrainingData(static_dir, batch_size=8, seed=0, shuffle_buffer=40)
    reads = []
    orig = data._read_unit
    monkeypatch.setattr(data, "_read_unit", lambda u: reads.append(u) or orig(u))
    n = data.batches_per_epoch(0)
    next(data.epoch_batches(0, n - 1))
    # the last batch needs the rows still in the buffer: far fewer than all 16 row groups
    assert 0 < len(reads) < len(data.units)


def test_memory_is_bounded_by_the_shuffle_buffer(static_dir, monkeypatch):
    data = PretrainingData(static_dir, batch_size=8, seed=0, shuffle_buffer=48)
    read = [0]
    orig = data._read_unit
    monkeypatch.setattr(data, "_read_unit", lambda u: read.__setitem__(0, read[0] + u.rows) or orig(u))
    yielded = 0
    for b in data.epoch_batches(0):
        yielded += b.size
        # rows held = read - handed out <= buffer + one row group (32 rows) + the batch being built
        assert read[0] - yielded <= 48 + 32 + 8
    assert read[0] == 512  # and each row group is read once per epoch


def test_ddp_ranks_read_distinct_rows_and_yield_equal_batch_counts(tmp_path):
    # 5 shards of uneven size, row groups of uneven size: every rank still gets as many rows
    d = make_examples(tmp_path, train_rows=300, rows_per_shard=70, row_group_size=32)
    for world in (2, 3):
        per_rank = [PretrainingData(d, batch_size=8, seed=0, rank=r, world_size=world) for r in range(world)]
        for epoch in (0, 1):
            ids = [[x for b in p.epoch_batches(epoch) for x in b.example_ids.tolist()] for p in per_rank]
            counts = {len(x) for x in ids}
            assert len(counts) == 1, counts  # same number of batches on every rank
            assert counts.pop() == per_rank[0].batches_per_epoch(epoch) * 8 == (300 // world) // 8 * 8
            for i in range(world):
                for j in range(i + 1, world):
                    assert not set(ids[i]) & set(ids[j])  # no row shared between ranks
            # a rank shares at most the row groups at the two ends of its slice
            units = [{per_rank[0]._unit_of(x).start for x in rank_ids} for rank_ids in ids]
            for i in range(world):
                assert len(units[i] & set().union(*(units[j] for j in range(world) if j != i))) <= 2
            # the same on resume: skipping batches replays the rank's slice
            again = [x for b in per_rank[-1].epoch_batches(epoch, 3) for x in b.example_ids.tolist()]
            assert again == ids[-1][3 * 8 :]


def test_dynamic_masking_rate_epochs_and_reruns(dynamic_dir):
    def masks(epoch):
        data = PretrainingData(dynamic_dir, batch_size=32, seed=11)
        out = {}
        for b in data.epoch_batches(epoch):
            T = b.input_ids.shape[1]
            for row, ex in enumerate(b.example_ids.tolist()):
                sel = (b.masked_positions // T) == row
                out[ex] = (b.masked_positions[sel] % T).tolist()
        return out, data

    m0, data = masks(0)
    m0_again, _ = masks(0)
    m1, _ = masks(1)
    assert m0 == m0_again  # reruns: identical masks
    changed = sum(m0[k] != m1[k] for k in m0)
    assert changed > 0.9 * len(m0)  # a new mask for (nearly) every example each epoch
    # ~15% of tokens, special tokens never masked
    tokens = masked = 0
    for b in data.epoch_batches(0):
        tokens += b.num_tokens
        masked += b.masked_positions.numel()
        assert not torch.isin(b.masked_lm_labels, torch.tensor([0, 1, 2, 3, 4])).any()
    assert 0.13 < masked / tokens < 0.17
    # masks depend on the example, not on the batch it lands in or the rank
    other = PretrainingData(dynamic_dir, batch_size=5, seed=11, rank=1, world_size=2)
    for b in other.epoch_batches(0):
        T = b.input_ids.shape[1]
        for row, ex in enumerate(b.example_ids.tolist()):
            sel = (b.masked_positions // T) == row
            assert (b.masked_positions[sel] % T).tolist() == m0[ex]


def test_dynamic_masks_are_mask_rows_of_the_row_seeded_by_seed_split_epoch_row(dynamic_dir):
    """Each example is masked alone by :func:`mask_rows` from ``default_rng([seed, split, epoch, row])``."""
    data = PretrainingData(dynamic_dir, batch_size=7, seed=3)
    rows = pq.read_table(dynamic_dir / "train" / "shard-00000.parquet").column("input_ids").to_pylist()
    seen = 0
    for b in data.epoch_batches(1):
        T = b.input_ids.shape[1]
        for r, ex in enumerate(b.example_ids.tolist()):
            if ex >= len(rows):
                continue
            ids = np.array(rows[ex], dtype=np.uint16)
            rng = np.random.default_rng([3, SPLIT_IDS["train"], 1, ex])
            out, pos, lbl, _ = mask_rows(ids, np.array([0, len(ids)]), rng, data.spec)
            sel = (b.masked_positions // T) == r
            assert (b.masked_positions[sel] % T).tolist() == pos.tolist()
            assert b.masked_lm_labels[sel].tolist() == lbl.tolist()
            assert b.input_ids[r, : len(ids)].tolist() == out.tolist()
            seen += 1
    assert seen > 50


def test_eval_batches_fixed_order_and_rank_split(static_dir, dynamic_dir):
    for d in (static_dir, dynamic_dir):
        one = PretrainingData(d, "valid", batch_size=10, seed=0)
        batches = list(one.eval_batches())
        ids = [x for b in batches for x in b.example_ids.tolist()]
        assert ids == list(range(96))  # file order, last batch short (96 = 9*10 + 6)
        again = list(PretrainingData(d, "valid", batch_size=10, seed=0).eval_batches())
        assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(batches, again))
        assert len(list(one.eval_batches(max_batches=3))) == 3
        # max_batches counts batches of batch_rows examples, split across the ranks in per-rank batches
        r0, r1 = (
            list(
                PretrainingData(d, "valid", batch_size=10, seed=0, rank=r, world_size=2).eval_batches(5, batch_rows=10)
            )
            for r in (0, 1)
        )
        assert len(r0) == 3 and len(r1) == 2
        split = sorted(x for b in r0 + r1 for x in b.example_ids.tolist())
        assert split == list(range(50))
        assert torch.equal(r1[0].input_ids, batches[1].input_ids)


def test_collate_flat_positions_are_offsets_into_b_times_t():
    rows = [
        (np.array([2, 9, 4, 3]), np.zeros(4), 0, np.array([2]), np.array([10])),
        (np.array([2, 4, 7, 3, 8, 3]), np.zeros(6), 1, np.array([1, 4]), np.array([5, 6])),
    ]
    b = collate_examples(rows, [0, 1])
    assert b.input_ids.shape == (2, 6)
    assert b.masked_positions.tolist() == [2, 6 + 1, 6 + 4]
    assert b.masked_lm_labels.tolist() == [10, 5, 6]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6]


def test_clear_errors_for_bad_examples_dirs(tmp_path, static_dir):
    with pytest.raises(BertraceError, match="run the examples stage"):
        load_manifest(tmp_path)
    d = make_examples(tmp_path / "x", train_rows=64, rows_per_shard=64)
    (d / "train" / "shard-00000.parquet").unlink()
    with pytest.raises(BertraceError, match="shard-00000.parquet: listed in .* but missing"):
        PretrainingData(d, batch_size=8)
    with pytest.raises(BertraceError, match="fewer than the per-rank batch size"):
        PretrainingData(static_dir, batch_size=1000).batches_per_epoch(0)


def test_dynamic_whole_word_masking_masks_whole_words(tmp_path):
    d = make_examples(tmp_path / "ex", masking="dynamic", whole_word_masking=True, train_rows=128)
    with pytest.raises(BertraceError, match="pass the tokenizer"):
        PretrainingData(d, batch_size=16)
    table = continuation_table(make_tokenizer(tmp_path / "tokenizer.json"))
    assert table[7] and table[8] and not table[6] and not table[9] and not table[2]
    data = PretrainingData(d, batch_size=16, seed=0, is_continuation=table)
    together = 0
    for b in data.epoch_batches(0):
        T = b.input_ids.shape[1]
        labels = dict(zip(b.masked_positions.tolist(), b.masked_lm_labels.tolist()))
        flat = b.input_ids.reshape(-1).tolist()
        for p, original in labels.items():
            # a masked continuation piece comes with the piece before it, unless a special
            # token ([CLS]/[SEP]) precedes it (then it starts the segment's first word)
            if table[original] and p % T and flat[p - 1] not in (2, 3):
                assert p - 1 in labels, f"position {p}: '##' piece masked without its word start"
                together += 1
            # and a masked piece never leaves the continuation after it unmasked
            if (p + 1) % T and p + 1 not in labels and table[flat[p + 1]]:
                pytest.fail(f"position {p}: word masked without its continuation at {p + 1}")
    assert together > 10


# ----------------------------------------------------------------------------- shard integrity


@pytest.fixture
def small_dir(tmp_path):
    return make_examples(tmp_path / "ex", train_rows=64, valid_rows=32, rows_per_shard=32)


def test_verify_shards_rehashes_every_shard_against_the_manifest(small_dir):
    from pipeline.core.io import sha256_file
    from pipeline.pretrain.data import verify_shards

    assert verify_shards(small_dir) == 3  # 2 train + 1 valid
    shard = small_dir / "train" / "shard-00001.parquet"
    recorded = load_manifest(small_dir)["splits"]["train"]["shards"][1]["sha256"]
    rewrite_shard(shard, flip_first_label)
    assert pq.read_metadata(shard).num_rows == 32  # the loader's row count check cannot see it
    with pytest.raises(BertraceError) as e:
        verify_shards(small_dir)
    msg = str(e.value)
    assert msg.startswith(f"{shard}: sha256 {sha256_file(shard)}, {small_dir / 'manifest.json'} records {recorded}")
    assert "dvc repro examples" in msg and "more shard" not in msg
    # a truncated valid shard and a missing train shard on top: the first named, the others counted
    truncate(small_dir / "valid" / "shard-00000.parquet")
    (small_dir / "train" / "shard-00000.parquet").unlink()
    with pytest.raises(
        BertraceError,
        match=r"train/shard-00000.parquet: listed in .*manifest.json but missing "
        r"\(and 2 more shards\)",
    ):
        verify_shards(small_dir, progress=True)


def test_missing_column_names_the_shard_and_the_column(small_dir):
    shard = rewrite_shard(small_dir / "train" / "shard-00001.parquet", lambda t: t.drop_columns(["masked_lm_ids"]))
    with pytest.raises(BertraceError) as e:
        PretrainingData(small_dir, batch_size=8)
    assert str(e.value).startswith(f"{shard}: has no column 'masked_lm_ids' (masking: static in ")
    rewrite_shard(shard, lambda t: t.drop_columns(["next_sentence_label"]))
    with pytest.raises(BertraceError, match=r"shard-00001.parquet: has no column 'next_sentence_label'; "):
        PretrainingData(small_dir, batch_size=8)
    rewrite_shard(
        small_dir / "valid" / "shard-00000.parquet",
        lambda t: t.set_column(0, "input_ids", pa.array([str(x) for x in t.column("input_ids").to_pylist()])),
    )
    with pytest.raises(BertraceError, match=r"valid/shard-00000.parquet: column 'input_ids' has type string"):
        PretrainingData(small_dir, "valid", batch_size=8)


def test_token_id_outside_the_vocabulary_names_the_shard(small_dir):
    def poison(column, row=5):
        def change(t):
            rows = t.column(column).to_pylist()
            rows[row] = [*rows[row][:-1], VOCAB]  # one id == vocab_size
            return set_column(t, column, rows)

        return change

    shard = rewrite_shard(small_dir / "train" / "shard-00001.parquet", poison("input_ids"))
    data = PretrainingData(small_dir, batch_size=8)  # the footer is fine: caught when the row group is read
    with pytest.raises(BertraceError) as e:
        list(data.epoch_batches(0))
    assert str(e.value).startswith(
        f"{shard}: row group 0 has input_ids id {VOCAB}, outside the vocabulary "
        f"(vocab_size {VOCAB} in {small_dir / 'manifest.json'})"
    )
    valid = rewrite_shard(small_dir / "valid" / "shard-00000.parquet", poison("masked_lm_ids", row=3))
    with pytest.raises(BertraceError, match=rf"{valid}: row group 0 has masked_lm_ids id {VOCAB}, outside"):
        list(PretrainingData(small_dir, "valid", batch_size=8).eval_batches())


# ----------------------------------------------------------------------------- the pretrain stage's checks


@pytest.fixture
def stage_dir(tmp_path, monkeypatch):
    """A repository-like working directory for ``stages.pretrain.main`` (no MLflow, no git)."""
    import yaml

    work = tmp_path / "work"
    make_examples(work / "data" / "examples", masking="dynamic", train_rows=64, valid_rows=32, rows_per_shard=32)
    params = {
        "model": {"preset": "tiny", "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "max_position": 64},
        "batch_size": 16,
        "max_steps": 2,
        "eval_every": 0,
        "num_threads": 1,
    }
    (work / "params.yaml").write_text(yaml.safe_dump({"compute": {"kernels": "portable"}, "pretrain": params}))
    monkeypatch.chdir(work)
    monkeypatch.setenv("BERTRACE_NO_MLFLOW", "1")
    return work


def _fake_pretrain(seen: dict):
    """Stands in for the training loop: keeps the provenance it was given, writes a last.pt embedding it."""
    from pipeline.models.checkpoint import save_checkpoint

    def pretrain(cfg, *, provenance, out_dir, **kw):
        seen["provenance"] = provenance
        seen["cfg"] = cfg
        seen["out_dir"] = out_dir
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        save_checkpoint(Path(out_dir) / "last.pt", {"step": 0, "provenance": provenance})
        return {"model_sha256": "0" * 64, "step": 0, "tokens_seen": 0, "train_seconds": 1.5, "tokens_per_s": 9.0}

    return pretrain


def test_pretrain_stage_refuses_a_rewritten_shard(stage_dir, monkeypatch):
    from stages import pretrain as stage

    seen: dict = {}
    monkeypatch.setattr(stage, "pretrain", _fake_pretrain(seen))
    stage.main([])  # intact shards: verified, and the record says so
    assert seen["provenance"]["shards_verified"] is True
    assert json.loads((stage_dir / "data/provenance/pretrain.json").read_text())["shards_verified"] is True
    # trained in the work directory, published to data/pretrain; the timings only in the run log
    assert seen["out_dir"] == stage.WORK == Path("runs/resume/pretrain")
    assert (stage_dir / "data/pretrain/last.pt").read_bytes() == (stage_dir / stage.WORK / "last.pt").read_bytes()
    report = json.loads((stage_dir / "reports/pretrain.json").read_text())
    assert report["model_sha256"] == "0" * 64 and "train_seconds" not in report and "tokens_per_s" not in report
    assert "tok_per_s" not in json.loads((stage_dir / "metrics/pretrain.json").read_text())
    log = json.loads((stage_dir / "runs/pretrain.json").read_text())
    assert log["timings"] == {"train_seconds": 1.5, "tokens_per_s": 9.0}
    # the run log names the record the checkpoint embeds: how trace finds this run from last.pt
    from pipeline.lineage.provenance import record_digest

    assert log["checkpoint_record_sha256"] == record_digest(seen["provenance"]) != log["record_sha256"]
    seen.clear()
    shard = rewrite_shard(Path("data/examples/train/shard-00001.parquet"), flip_first_label)
    with pytest.raises(
        BertraceError,
        match=rf"^{shard}: sha256 [0-9a-f]{{64}}, data/examples/manifest.json "
        r"records [0-9a-f]{64}.*dvc repro examples",
    ):
        stage.main([])
    assert not seen  # refused before training


def test_pretrain_stage_verify_shards_false_skips_and_records_it(stage_dir, monkeypatch, capsys):
    from types import SimpleNamespace

    import yaml

    from stages import pretrain as stage

    rewrite_shard(Path("data/examples/train/shard-00001.parquet"), flip_first_label)
    manifest = load_manifest("data/examples")
    assert stage.check_shards(SimpleNamespace(verify_shards=False), manifest, 0, 1) is False
    assert "verify_shards is false" in capsys.readouterr().out
    with pytest.raises(BertraceError, match="shard-00001.parquet: sha256"):
        stage.check_shards(SimpleNamespace(), manifest, 0, 1)  # a config without the field: verify
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["pretrain"]["verify_shards"] = False
    Path("params.yaml").write_text(yaml.safe_dump(params))
    seen: dict = {}
    monkeypatch.setattr(stage, "pretrain", _fake_pretrain(seen))
    stage.main([])
    assert seen["provenance"]["shards_verified"] is False
    assert json.loads(Path("data/provenance/pretrain.json").read_text())["shards_verified"] is False


def test_pretrain_stage_refuses_a_tokenizer_the_shards_were_not_made_with(stage_dir, monkeypatch):
    from stages import pretrain as stage

    monkeypatch.setattr(stage, "pretrain", _fake_pretrain({}))
    tok = make_tokenizer(Path("data/tokenizer").mkdir(parents=True) or Path("data/tokenizer/tokenizer.json"))
    with pytest.raises(BertraceError) as e:
        stage.main([])
    msg = str(e.value)
    assert msg.startswith(
        f"{tok}: sha256 {hashlib.sha256(tok.read_bytes()).hexdigest()}, but "
        f"data/examples/manifest.json was made with tokenizer {TOKENIZER_SHA}"
    )
    assert "rerun it (dvc repro examples)" in msg
    # the tokenizer the manifest names passes
    manifest = json.loads(Path("data/examples/manifest.json").read_text())
    manifest["tokenizer_sha256"] = hashlib.sha256(tok.read_bytes()).hexdigest()
    Path("data/examples/manifest.json").write_text(json.dumps(manifest))
    stage.main([])
