"""A tiny pre-training config and a runner of the pre-training loop, for the loop's and the objectives' tests."""

from __future__ import annotations

from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.loop import pretrain

TINY = {"preset": "tiny", "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "max_position": 64}


def tiny_cfg(**kw) -> PretrainConfig:
    base = dict(
        objective="mlm_nsp",
        embedding_init={"method": "random"},
        model=dict(TINY),
        batch_size=16,
        lr=3e-3,
        warmup=0.1,
        max_steps=20,
        eval_every=0,
        eval_batches=None,
        log_every=1,
        checkpoint_every=None,
        checkpoint_minutes=None,
        shuffle_buffer=64,
        seed=0,
        num_threads=1,
        snapshot_steps=[],
    )
    base.update(kw)
    return PretrainConfig(**base)


def run(cfg, examples, out, **kw):
    logs: list[tuple[int, dict]] = []
    metrics = pretrain(
        cfg,
        examples_dir=examples,
        out_dir=out,
        provenance={"git": {"commit": "abc", "dirty": False}},
        on_log=lambda step, m: logs.append((step, m)),
        progress=False,
        **kw,
    )
    return metrics, logs


def train_logs(logs):
    return [(s, m) for s, m in logs if "loss" in m]


def small_examples(directory):
    """256 train / 32 valid rows of dynamic-masking examples in shards of 64 (row groups of 16): the
    data of the loop's tests (tests.support.examples_data.make_examples)."""
    from tests.support.examples_data import make_examples

    return make_examples(
        directory, masking="dynamic", train_rows=256, valid_rows=32, rows_per_shard=64, row_group_size=16
    )
