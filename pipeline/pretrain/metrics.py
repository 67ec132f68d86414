"""What pre-training measures and writes beside its checkpoints: validation metrics, the loss curves
(CSV, DVC plots) and the split of the returned numbers into metrics and :data:`TIMINGS`.

Times are not results: the checkpoints and loss curves of a step or epoch budget hold no durations
or throughput, so two runs of the same commit, params and data write the same bytes; the timings go
to the stage's run log only."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path
from typing import Any

import torch

from pipeline.core.errors import BertraceError
from pipeline.core.io import atomic_open
from pipeline.pretrain.data import PretrainingData
from pipeline.pretrain.distributed import all_reduce, autocast
from pipeline.pretrain.objectives.base import Objective

TRAIN_CURVE = "pretrain_loss.csv"
VAL_CURVE = "pretrain_val.csv"
# What pretrain() returns that the wall clock decides: the stage's run log, never a DVC output.
TIMINGS = ("train_seconds", "tokens_per_s", "steps_per_s", "mfu", "embedding_init_seconds")


@torch.no_grad()
def validation_metrics(
    model: torch.nn.Module,
    objective: Objective,
    data: PretrainingData,
    device: torch.device,
    autocast_dtype=None,
    max_batches: int | None = None,
    world: int = 1,
    batch_rows: int | None = None,
) -> dict[str, float]:
    """The objective's validation metrics over ``data``'s validation batches (all ranks):
    the first ``max_batches * batch_rows`` examples of the split (``batch_rows``: the global
    ``pretrain.batch_size``, so the sample is the same on any number of processes), split
    across the ranks in micro-batches; None/0: the whole split."""
    was_training = model.training
    model.eval()
    sums = None
    for batch in data.eval_batches(max_batches or None, batch_rows=batch_rows):
        batch = batch.to(device)
        with autocast(device, autocast_dtype):
            out = objective.forward(model, batch)
        s = objective.eval_sums(out, batch)
        sums = s if sums is None else sums + s
    if sums is None:
        raise BertraceError("validation split produced no batches; check data/examples/valid shards")
    all_reduce(sums, world)
    model.train(was_training)
    return objective.eval_metrics(sums.tolist())


def model_sha256(model: torch.nn.Module) -> str:
    """sha256 over the state dict's names, dtypes, shapes and bytes (identifies the weights)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def curve_columns(objective: Objective) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The columns of the training and validation CSVs for ``objective`` (no times: see the module docstring)."""
    return (
        ("step", "tokens", "lr", *objective.loss_names, "grad_norm"),
        ("step", "tokens", *objective.val_names),
    )


def split_timings(metrics: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(metrics, timings)``: what ``pretrain()`` (pipeline/pretrain/loop.py) returned, without and with only the :data:`TIMINGS` keys."""
    return (
        {k: v for k, v in metrics.items() if k not in TIMINGS},
        {k: v for k, v in metrics.items() if k in TIMINGS},
    )


def write_curves(history: list[dict], out_dir: Path, objective: Objective) -> tuple[Path, Path]:
    """Training and validation curves as CSV (DVC plots): one row per log / evaluation."""
    paths = []
    train_cols, val_cols = curve_columns(objective)
    for name, columns, key in (
        (TRAIN_CURVE, train_cols, objective.loss_names[0]),
        (VAL_CURVE, val_cols, objective.val_names[0]),
    ):
        path = out_dir / name
        with atomic_open(path, "w") as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
            w.writeheader()
            for row in history:
                if key in row:
                    w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
        paths.append(path)
    return paths[0], paths[1]
