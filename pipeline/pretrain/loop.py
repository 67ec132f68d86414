"""The pre-training loop: AdamW, linear warmup/decay, a budget, AMP, DDP, exact resume.

*What* is learnt is an objective (``pipeline/pretrain/objectives/``: BERT's MLM + NSP by default); this
file is *how*: :class:`Trainer` runs updates (``train_step``), validation (``evaluate``),
checkpoints (``save_last``, snapshots) and logging windows, :class:`Budget` says when to stop
and what the learning rate is, and :func:`pretrain` wires data, model and trainer together.

The recipe is Google's ``run_pretraining.py`` / ``optimization.py`` (Devlin et al. 2019,
appendix A.2): AdamW with decoupled weight decay 0.01 (none on biases and LayerNorm),
``eps=1e-6``, gradient clipping at global norm 1.0, linear warmup then linear decay to 0.
Two deliberate differences:

* the decay starts at the end of warmup (Google decays from step 0 and overrides the first
  steps with the ramp, so its peak is ``lr * (1 - warmup/total)``); and
* the learning rate is a pure *function* of ``(step, budget)`` evaluated at every update,
  never a stateful scheduler: resuming with a larger budget stretches the schedule instead of
  pinning the rate at 0.

Budgets: ``max_steps`` (the default) or ``epochs`` are counts of updates, so the same commit and
params give the same weights on any machine of the same kind (see ``pipeline/core/device.py`` for
what "same kind" means). ``time_minutes`` is wall clock, as in cramming (Geiping & Goldstein
2022, section 3): progress is ``elapsed / budget``, so the weights depend on the machine's speed
and load; a checkpoint trained so records ``budget.deterministic: false`` and ``bertrace trace``
says so. ``snapshot_minutes`` and ``checkpoint_minutes`` are wall clock too: they never change
the weights, but which weights a minute-snapshot holds, and which rows the loss curves log (a
checkpoint closes a logging window), depend on speed; ``snapshot_steps`` and
``checkpoint_every`` are the reproducible equivalents.

``batch_size`` is the *global* batch: examples per optimizer update over all ranks and
accumulation steps, so a change of world size keeps the optimisation the same. Each rank
reads ``batch_size / (grad_accum * world_size)`` examples per micro-batch.

Exact resume: a checkpoint holds the model, optimizer and scaler states, every rank's RNG
states and the data position ``(epoch, batches consumed)``; the loader replays its shuffle
from that position, so an interrupted run continues bit-for-bit like an uninterrupted one
(same device, precision and world size). That is tested on the CPU. On CUDA it also needs
``pretrain.deterministic: true`` (pipeline/core/device.py): otherwise the backward of the MLM gather
(``index_select``) and of memory-efficient attention accumulate with atomics in no fixed order
and a resumed run drifts from an uninterrupted one in the last bits. Under DDP only rank 0
reads ``last.pt`` and it broadcasts the state, so nodes need no shared filesystem.

Times are not results: the checkpoints and loss curves of a step or epoch budget hold no
durations or throughput, so two runs of the same commit, params and data write the same bytes.
:func:`pretrain` still returns the session's timings (:data:`TIMINGS`: ``train_seconds``,
``tokens_per_s``, ``steps_per_s``, ``mfu``, ``embedding_init_seconds``) beside its metrics, for the
stage's run log (:func:`split_timings`). A run the wall clock governs (``time_minutes``,
``snapshot_minutes``, ``checkpoint_minutes``) keeps ``train_seconds`` in its checkpoints: its
resume needs it.

``compile: true``: the first update of a session compiles the model; the clock (a
``time_minutes`` budget, ``train_seconds``, throughput, MFU) starts after it, and shapes are
dynamic from the start, so a step budget's schedule and a time budget's warm-up both belong to
training, not to compilation.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import math
import random
import time
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

import numpy as np
import torch
import torch.distributed as dist
from pydantic import Field, ValidationError, field_serializer, field_validator, model_validator
from tqdm import tqdm

from pipeline.core.config import Bool, Float, Int, Section, Str, format_errors
from pipeline.core.device import (
    arithmetic_state,
    build_adamw,
    mfu,
    precision_name,
    resolve_device,
    resolve_precision,
    restore_deterministic,
    set_deterministic,
)
from pipeline.core.errors import BertraceError
from pipeline.core.io import atomic_open, canonical_json, sha256_file
from pipeline.models import checkpoint as ckpt_lib
from pipeline.models.bert import BertConfig, ModelParams, config_from_params, num_parameters, param_groups
from pipeline.pretrain.data import PretrainingData, continuation_table, load_manifest, prefetch
from pipeline.pretrain.objectives.registry import OBJECTIVES, ElectraParams, MlmNspParams, Objective, make_objective
from pipeline.pretrain.wordvec import EmbeddingInit, initialise_embedding

# Keys a resumed run may change: the budget (to extend the schedule; resume: true only), cadence and hardware.
# Any other change would silently mix two recipes in one checkpoint.
RESUMABLE_CHANGES = (
    "max_steps",
    "epochs",
    "time_minutes",
    "eval_every",
    "eval_batches",
    "log_every",
    "checkpoint_every",
    "checkpoint_minutes",
    "snapshot_minutes",
    "snapshot_steps",
    "device",
    "precision",
    "tf32",
    "compile",
    "num_threads",
    "deterministic",
    "verify_shards",
    "resume",
)
BUDGETS = ("max_steps", "epochs", "time_minutes")
TRAIN_CURVE = "pretrain_loss.csv"
VAL_CURVE = "pretrain_val.csv"
# What pretrain() returns that the wall clock decides: the stage's run log, never a DVC output.
TIMINGS = ("train_seconds", "tokens_per_s", "steps_per_s", "mfu", "embedding_init_seconds")


Positive = Annotated[Int, Field(ge=1)]
NotNegative = Annotated[Int, Field(ge=0)]
NotNegativeFloat = Annotated[Float, Field(ge=0)]
AboveZero = Annotated[Float, Field(gt=0)]
_SNAPSHOT = "e.g. snapshot_steps: [2000, 4000] or snapshot_minutes: [15, 30]"


class PretrainConfig(Section):
    """The ``pretrain`` section of params.yaml; the defaults are params.yaml's values."""

    SECTION = "pretrain"

    objective: Str = "mlm_nsp"  # what is learnt: an OBJECTIVES name (pipeline/pretrain/objectives/<name>.py)
    # a preset (tiny|mini|small|medium|base|large) and BertConfig overrides (pipeline/models/bert.py)
    model: ModelParams = ModelParams(preset="tiny", dropout=0.0, attention_dropout=0.0)
    # continued pre-training: start from these weights (our .pt, or a Hugging Face model directory / hub
    # pointer file, pipeline/interop/hf_import.py) instead of a random init; its architecture wins over `model`
    # (whose dropout / attention_dropout still apply); null: random init
    init: Str | None = None
    batch_size: Positive = 32  # examples per optimizer update, all ranks and accumulation steps together
    grad_accum: Positive = 1  # micro-batches per update
    lr: AboveZero = 1e-3  # peak learning rate
    # < 1: fraction of the budget; >= 1: number of updates
    warmup: Annotated[Float, Field(ge=0, description="a fraction < 1 of the budget, or a number of updates")] = 0.06
    weight_decay: NotNegativeFloat = 0.01
    betas: tuple[Float, Float] = (0.9, 0.999)
    eps: AboveZero = 1e-6
    clip_grad_norm: NotNegativeFloat = 1.0  # 0 disables clipping
    mlm_nsp: MlmNspParams = MlmNspParams()  # objective mlm_nsp: the NSP term's weight
    electra: ElectraParams = ElectraParams()  # objective electra: generator size, discriminator loss weight
    embedding_init: EmbeddingInit = EmbeddingInit()  # random, or skip-gram vectors from the examples (wordvec.py)
    # budget: exactly one of these
    max_steps: NotNegative | None = 8000  # optimizer updates (reproducible)
    epochs: NotNegativeFloat | None = None  # passes over the training shards, may be fractional (reproducible)
    time_minutes: NotNegativeFloat | None = None  # wall clock, the lr schedule follows elapsed time (NOT reproducible)
    # keep the weights at these updates (snapshots/step-000500.pt)
    snapshot_steps: Annotated[list[Annotated[Int, Field(gt=0)]], Field(description=_SNAPSHOT)] = [2000, 4000]
    # ... and/or at these elapsed minutes (snapshots/minute-015.pt; wall clock)
    snapshot_minutes: Annotated[list[Annotated[Float, Field(gt=0)]], Field(description=_SNAPSHOT)] = []
    eval_every: NotNegative = 500  # updates between validations (0: only at the end)
    eval_batches: NotNegative | None = (
        20  # validation batches of batch_size (global) examples per evaluation (None/0: all)
    )
    log_every: Positive = 20  # updates between training-metric logs
    checkpoint_every: NotNegative | None = 500  # updates between checkpoints (None/0: off)
    checkpoint_minutes: NotNegativeFloat | None = None  # and/or minutes between checkpoints (None/0: off; wall clock)
    shuffle_buffer: Int = 10_000  # examples in each rank's shuffle buffer
    seed: Int = 0
    device: Str = "auto"  # auto (cuda -> mps -> cpu) | cpu | cuda | cuda:N | mps
    precision: Literal["auto", "fp32", "bf16", "fp16"] = (
        "auto"  # auto: bf16 (else fp16) on CUDA; bf16 on CPUs with bf16 instructions, else fp32
    )
    tf32: Bool = True  # TensorFloat-32 matmuls on Ampere+ GPUs
    compile: Bool = False  # torch.compile the model (dynamic shapes; compile time is not in time_minutes)
    num_threads: NotNegative = 2  # torch CPU threads (0: torch's default, the host's core count)
    deterministic: Bool = True  # deterministic kernels (pipeline/core/device.py); no cost on the CPU
    verify_shards: Bool = True  # rehash the example shards against their manifest before training
    resume: Literal["auto", True, False] = "auto"  # the stage's resume= (see pretrain()); --no-resume wins

    def __init__(self, **data: Any):
        """Keyword construction, with the same errors as :meth:`from_params`."""
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise BertraceError(format_errors(e, type(self), self.SECTION, "params.yaml")) from None

    def __setattr__(self, name: str, value: Any):
        try:
            super().__setattr__(name, value)
        except ValidationError as e:
            raise BertraceError(format_errors(e, type(self), self.SECTION, "params.yaml")) from None

    @field_validator("objective")
    @classmethod
    def _objective(cls, v: str) -> str:
        if v == "bert":
            raise ValueError(
                "'bert' is now called mlm_nsp (MLM + NSP, as BERT); use objective: mlm_nsp, or mlm "
                "for the masked LM alone (the former nsp_weight: 0)"
            )
        if v not in OBJECTIVES:
            raise ValueError(f"must be one of {', '.join(sorted(OBJECTIVES))} (pipeline/pretrain/objectives/)")
        return v

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data):
        if isinstance(data, dict) and "nsp_weight" in data:
            raise ValueError(
                f"nsp_weight = {data['nsp_weight']!r} is gone: remove it and set objective: mlm_nsp "
                "(MLM + NSP, its weight in mlm_nsp.nsp_weight) or objective: mlm (the former "
                "nsp_weight: 0)"
            )
        return data

    @field_serializer("model")
    def _model_as_written(self, model: ModelParams) -> dict:
        return model.to_dict()  # the keys given, as checkpoints have always recorded them

    @field_validator("resume", mode="before")
    @classmethod
    def _resume(cls, v):
        if v != "auto" and not isinstance(v, bool):
            raise ValueError("must be auto, true or false")
        return v

    @field_validator("betas", mode="before")
    @classmethod
    def _two_betas(cls, v):
        if not isinstance(v, (list, tuple)) or len(v) != 2:
            raise ValueError("must be two numbers, e.g. [0.9, 0.999]")
        return v

    @field_validator("snapshot_steps", "snapshot_minutes")
    @classmethod
    def _in_order(cls, v: list) -> list:
        return sorted(v)

    @model_validator(mode="after")
    def _recipe(self) -> "PretrainConfig":
        for name in BUDGETS:
            if getattr(self, name) == 0:
                unit = "1 update" if name == "max_steps" else "a positive number"
                raise BertraceError(
                    f"params.yaml: pretrain.{name} = 0: a budget of nothing trains nothing; set it to at "
                    f"least {unit}, or to null and give the budget as {' or '.join(b for b in BUDGETS if b != name)}"
                )
        budgets = [n for n in BUDGETS if getattr(self, n) is not None]
        if len(budgets) != 1:
            raise BertraceError(
                "params.yaml: pretrain needs exactly one budget: max_steps, epochs or time_minutes "
                f"(got {budgets or 'none'}); set the others to null"
            )
        if self.batch_size % self.grad_accum:
            raise BertraceError(
                f"params.yaml: pretrain.batch_size = {self.batch_size}: must be a multiple of "
                f"grad_accum ({self.grad_accum}); fix it in params.yaml"
            )
        if self.time_minutes and self.warmup >= 1:
            raise BertraceError(
                f"params.yaml: pretrain.warmup = {self.warmup!r}: with a time_minutes budget give "
                "warmup as a fraction of the budget (e.g. 0.06)"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (what checkpoints store as ``train_config`` and resume compares)."""
        return json.loads(canonical_json(self.model_dump(mode="json")))

    @property
    def budget_kind(self) -> str:
        """max_steps | epochs | time_minutes: the one budget set."""
        return next(n for n in BUDGETS if getattr(self, n) not in (None, 0))

    @property
    def wall_clock(self) -> bool:
        """Whether the wall clock decides what the run does (a ``time_minutes`` budget, minute
        snapshots or checkpoints): its checkpoints then keep ``train_seconds`` to resume from."""
        return bool(self.time_minutes or self.snapshot_minutes or self.checkpoint_minutes)


# ----------------------------------------------------------------------------- schedule


def snapshot_path(out_dir: str | Path, minute: float) -> Path:
    """Where ``pretrain.snapshot_minutes`` keeps the weights at ``minute``: snapshots/minute-015.pt."""
    label = f"{int(minute):03d}" if minute == int(minute) else f"{minute:07.3f}".rstrip("0")
    return Path(out_dir) / "snapshots" / f"minute-{label}.pt"


def step_snapshot_path(out_dir: str | Path, step: int) -> Path:
    """Where ``pretrain.snapshot_steps`` keeps the weights after update ``step``: snapshots/step-002000.pt."""
    return Path(out_dir) / "snapshots" / f"step-{int(step):06d}.pt"


def lr_at_step(step: int, *, peak: float, warmup_steps: int, total_steps: int) -> float:
    """Rate for update ``step`` (0-based): linear ramp to ``peak`` at update ``warmup_steps - 1``,
    then linear decay reaching 0 at ``total_steps`` (the end of the budget)."""
    ramp = (step + 1) / warmup_steps if warmup_steps > 0 else 1.0
    decay = (total_steps - step) / max(total_steps - warmup_steps, 1)
    return peak * max(0.0, min(1.0, ramp, decay))


def lr_at_progress(progress: float, *, peak: float, warmup_fraction: float) -> float:
    """Rate at ``progress`` (0..1) through a wall-clock budget (cramming's time-based schedule)."""
    ramp = progress / warmup_fraction if warmup_fraction > 0 else 1.0
    decay = (1.0 - progress) / max(1.0 - warmup_fraction, 1e-9)
    return peak * max(0.0, min(1.0, ramp, decay))


def warmup_steps_for(warmup: float, total_steps: int) -> int:
    """``warmup`` < 1 is a fraction of ``total_steps``; otherwise a step count."""
    return int(round(warmup * total_steps)) if warmup < 1 else int(warmup)


class Budget:
    """When training ends and the learning rate on the way: a number of updates (``max_steps``,
    or ``epochs`` converted to updates over the shards) or wall-clock minutes (``time_minutes``)."""

    def __init__(self, cfg: PretrainConfig, data: PretrainingData, extends: list[dict] | None = None):
        self.extends = list(extends or [])  # earlier budgets this run's weights were trained under (resume: true)
        self.kind = cfg.budget_kind
        self.value = getattr(cfg, self.kind)
        self.peak, self.warmup = cfg.lr, cfg.warmup
        self.total_steps = self._steps(cfg, data)  # None for a time budget
        self.seconds = cfg.time_minutes * 60.0 if cfg.time_minutes else None
        self.warmup_steps = warmup_steps_for(cfg.warmup, self.total_steps) if self.total_steps else 0

    @staticmethod
    def _steps(cfg: PretrainConfig, data: PretrainingData) -> int | None:
        if cfg.max_steps:
            return int(cfg.max_steps)
        if cfg.epochs:
            full = int(cfg.epochs)
            micro = sum(data.batches_per_epoch(e) for e in range(full))
            micro += int(round((cfg.epochs - full) * data.batches_per_epoch(full)))
            steps = micro // cfg.grad_accum
            if steps < 1:
                raise BertraceError(f"params.yaml: pretrain.epochs = {cfg.epochs} is less than one update; raise it")
            return steps
        return None

    @property
    def deterministic(self) -> bool:
        """Whether the weights follow from commit + params (not from the machine's speed)."""
        return self.total_steps is not None

    def lr(self, step: int, elapsed: float) -> float:
        if self.total_steps is not None:
            return lr_at_step(step, peak=self.peak, warmup_steps=self.warmup_steps, total_steps=self.total_steps)
        return lr_at_progress(min(elapsed / self.seconds, 1.0), peak=self.peak, warmup_fraction=self.warmup)

    def finished(self, step: int, elapsed: float) -> bool:
        return step >= self.total_steps if self.total_steps is not None else elapsed >= self.seconds

    def record(self) -> dict[str, Any]:
        """For the provenance and the metrics: ``{kind, value, steps, deterministic}``, and
        ``extends`` when the run continued a checkpoint trained under another budget."""
        return {
            "kind": self.kind,
            "value": self.value,
            "steps": self.total_steps,
            "deterministic": self.deterministic,
            **({"extends": self.extends} if self.extends else {}),
        }


def budget_of(train_config: dict) -> dict[str, Any]:
    """The budget keys of a checkpoint's ``train_config`` (or of ``PretrainConfig.to_dict()``)."""
    return {k: train_config.get(k) for k in BUDGETS}


def extended_budgets(state: dict, cfg: PretrainConfig) -> list[dict]:
    """The earlier budgets behind a resumed ``state``'s weights: the ones its own run extended,
    plus its budget when it differs from ``cfg``'s (the schedule then stretches from its step)."""
    earlier = list(((state.get("provenance") or {}).get("budget") or {}).get("extends") or [])
    old = budget_of(state.get("train_config") or {})
    if old != budget_of(cfg.to_dict()):
        earlier.append({**{k: v for k, v in old.items() if v is not None}, "at_step": state["step"]})
    return earlier


# ----------------------------------------------------------------------------- distributed


def _dist() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce(t: torch.Tensor, world: int) -> torch.Tensor:
    if world > 1:
        dist.all_reduce(t)
    return t


def _cpu_group(world: int):
    """A process group whose collectives run on the CPU: the default one under gloo, else a gloo
    group over the same ranks (a collective call: every rank creates it). None for one process."""
    if world == 1 or dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


def _broadcast_float(value: float, device: torch.device, world: int, group=None) -> float:
    """Rank 0's value on every rank (clocks differ; decisions must not). A CPU tensor over a CPU
    group (:func:`_cpu_group`): no GPU→CPU synchronisation, so the host keeps running ahead of
    the GPU (``device`` is not used; kept for callers)."""
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.broadcast(t, src=0, group=group)
    return float(t.item())


def _gather_rng(world: int, rank: int) -> list[dict] | None:
    state = ckpt_lib.rng_state()
    if world == 1:
        return [state]
    out = [None] * world if rank == 0 else None
    dist.gather_object(state, out, dst=0)
    return out


def _autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


# ----------------------------------------------------------------------------- evaluation


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
        with _autocast(device, autocast_dtype):
            out = objective.forward(model, batch)
        s = objective.eval_sums(out, batch)
        sums = s if sums is None else sums + s
    if sums is None:
        raise BertraceError("validation split produced no batches; check data/examples/valid shards")
    _all_reduce(sums, world)
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


# ----------------------------------------------------------------------------- curves


def curve_columns(objective: Objective) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The columns of the training and validation CSVs for ``objective`` (no times: see the module docstring)."""
    return (
        ("step", "tokens", "lr", *objective.loss_names, "grad_norm"),
        ("step", "tokens", *objective.val_names),
    )


def split_timings(metrics: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(metrics, timings)``: what :func:`pretrain` returned, without and with only the :data:`TIMINGS` keys."""
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


# ----------------------------------------------------------------------------- the trainer


class Trainer:
    """One pre-training run's state and its pieces: ``train_step`` (one optimizer update),
    ``close_window`` (log the metrics since the last log), ``evaluate``, ``save_last`` /
    ``save_snapshot`` and ``fit`` (the loop that calls them as the budget and cadence say).

    Everything objective-specific goes through ``self.objective``; only rank 0 writes files."""

    def __init__(
        self,
        cfg: PretrainConfig,
        objective: Objective,
        *,
        model: torch.nn.Module,
        config,
        train_data: PretrainingData,
        valid_data: PretrainingData | None,
        device: torch.device,
        autocast_dtype: torch.dtype | None,
        use_scaler: bool,
        world: int,
        rank: int,
        micro: int,
        out_dir: Path,
        curves_dir: Path,
        provenance: dict,
        on_log: Callable | None,
    ):
        self.cfg, self.objective, self.config = cfg, objective, config
        self.raw_model = self.model = model
        self.train_data, self.valid_data = train_data, valid_data
        self.device, self.autocast_dtype, self.use_scaler = device, autocast_dtype, use_scaler
        self.world, self.rank, self.main, self.micro = world, rank, rank == 0, micro
        self.out_dir, self.curves_dir, self.provenance, self.on_log = out_dir, curves_dir, provenance, on_log
        self.last_path, self.best_path = out_dir / ckpt_lib.LAST, out_dir / ckpt_lib.BEST
        self.optimizer = build_adamw(
            param_groups(model, cfg.weight_decay), device, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
        self.budget: Budget | None = None
        # progress
        self.step, self.tokens_seen, self.elapsed = 0, 0, 0.0
        self.epoch, self.batch_in_epoch = 0, 0
        self.best = math.inf
        self.history: list[dict] = []
        self.last_val: dict[str, float] = {}
        self.train_metrics: dict[str, float] = {}

    # -- state ---------------------------------------------------------------------------

    def restore(self, state: dict) -> None:
        """Continue from a ``last.pt`` state (weights, optimizer, position, RNG)."""
        self.raw_model.load_state_dict(state["model"])
        # load_state_dict also restores the saved run's implementation flags (fused, foreach, ...):
        # a checkpoint from an unfused run (CPU, or any other device) would turn fused AdamW off,
        # while the GradScaler, which checked the optimizer when it was built, still passes it
        # grad_scale / found_inf (plain AdamW then raises). Hyperparameters come from the
        # checkpoint, the kernel choice from this run.
        impl = {
            k: v
            for k, v in self.optimizer.defaults.items()
            if k in ("fused", "foreach", "capturable", "differentiable")
        }
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:
            group.update(impl)
        if self.use_scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        # a step or epoch budget's checkpoint holds no train_seconds: its clock restarts at 0
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.elapsed = float(state.get("train_seconds", 0.0))
        pos = state["data_position"]
        self.epoch, self.batch_in_epoch = pos["epoch"], pos["batch"]
        if (pos["world_size"], pos["micro_batch"]) != (self.world, self.micro):  # same examples consumed, roughly
            self.batch_in_epoch = pos["batch"] * pos["world_size"] * pos["micro_batch"] // (self.world * self.micro)
        key = f"best_{self.objective.best_metric}"
        self.best = state.get(key) or math.inf
        if self.best_path.exists():
            self.best = min(self.best, ckpt_lib.load_checkpoint(self.best_path).get(key) or math.inf)
        self.history = list(state.get("history", []))
        self.last_val = dict(state.get("metrics") or {})
        # The training metrics of the window that closed at the saved step: what a run resumed at
        # the end of its budget (killed after the final save) reports, as it trains no step itself.
        row = next((r for r in reversed(self.history) if r.get("step") == self.step and "loss" in r), None)
        if row is not None:
            self.train_metrics = {k: v for k, v in row.items() if k not in ("step", "tokens", "seconds")}
        rngs = state["rng"]
        if len(rngs) == self.world:
            ckpt_lib.set_rng_state(rngs[self.rank])
        else:
            torch.manual_seed(self.cfg.seed + 1000 * self.step + self.rank)

    def checkpoint_state(self, full: bool) -> dict[str, Any]:
        """``last.pt`` (``full``: resumable) or the lean weights-only kind (best.pt, snapshots)."""
        s = {
            "model": self.raw_model.state_dict(),
            "model_config": self.config.to_dict(),
            "train_config": self.cfg.to_dict(),
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            f"best_{self.objective.best_metric}": None if self.best == math.inf else self.best,
            "metrics": dict(self.last_val),
            "provenance": self.provenance,
        }
        if self.cfg.wall_clock:  # what its resume continues from (the budget, the minute snapshots)
            s["train_seconds"] = self.elapsed
        if full:
            s.update(
                {
                    "optimizer": self.optimizer.state_dict(),
                    "scaler": self.scaler.state_dict() if self.use_scaler else {},
                    "data_position": {
                        "epoch": self.epoch,
                        "batch": self.batch_in_epoch,
                        "world_size": self.world,
                        "micro_batch": self.micro,
                    },
                    "history": self.history,
                }
            )
        return s

    def save_last(self) -> None:
        rngs = _gather_rng(self.world, self.rank)  # a collective: every rank takes part
        if self.main:
            ckpt_lib.save_checkpoint(self.last_path, {**self.checkpoint_state(True), "rng": rngs})
            write_curves(self.history, self.curves_dir, self.objective)

    def save_snapshot(self, path: Path) -> None:
        """The weights as they are now, in best.pt's format (fine-tune them directly)."""
        if self.main:
            ckpt_lib.save_checkpoint(path, self.checkpoint_state(False))

    # -- one update, one log, one evaluation ---------------------------------------------

    def train_step(self, stream, lr: float) -> None:
        """One optimizer update over ``grad_accum`` micro-batches at rate ``lr``; the objective's
        losses and the gradient norm go into the logging window."""
        cfg, obj = self.cfg, self.objective
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        for k in range(cfg.grad_accum):
            self.epoch, i, batch = next(stream)
            self.batch_in_epoch = i + 1
            self.win_tokens += batch.num_tokens  # counted on the host: no device sync
            batch = batch.to(self.device, non_blocking=True)
            sync = k == cfg.grad_accum - 1 or self.world == 1
            with contextlib.nullcontext() if sync else self.model.no_sync():
                with _autocast(self.device, self.autocast_dtype):
                    losses = obj.losses(obj.forward(self.model, batch), batch)
                self.scaler.scale(losses["loss"] / cfg.grad_accum).backward()
            part = torch.stack([losses[n].detach() for n in obj.loss_names]).double() / cfg.grad_accum
            self.win[:-1] += part
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.raw_model.parameters(), cfg.clip_grad_norm if cfg.clip_grad_norm else math.inf
        )
        self.win[-1] += grad_norm.double()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.win_steps += 1

    def open_window(self) -> None:
        # the objective's loss sums, then the grad norm sum
        self.win = torch.zeros(len(self.objective.loss_names) + 1, dtype=torch.float64, device=self.device)
        self.win_tokens, self.win_steps, self.win_t0 = 0, 0, time.perf_counter()

    def close_window(self, lr: float) -> dict[str, float]:
        """Mean training metrics since the last log (all ranks), appended to the history."""
        names = self.objective.loss_names
        stats = torch.cat([self.win, torch.tensor([self.win_tokens], dtype=torch.float64, device=self.device)])
        _all_reduce(stats, self.world)
        s = stats.tolist()
        self.tokens_seen += int(s[-1])
        dt = max(time.perf_counter() - self.win_t0, 1e-9)
        n = self.win_steps * self.world
        m = {name: s[i] / n for i, name in enumerate(names)}
        m.update({"lr": lr, "grad_norm": s[len(names)] / n, "tokens_per_s": s[-1] / dt})
        if not math.isfinite(m["loss"]):
            raise BertraceError(
                f"pre-training diverged: loss is {m['loss']} at step {self.step}; lower pretrain.lr, raise "
                f"pretrain.warmup or use precision: fp32/bf16, then delete {self.out_dir} and rerun"
            )
        self.train_metrics = m
        untimed = {k: v for k, v in m.items() if k != "tokens_per_s"}  # on_log and the bar show the throughput
        self.history.append({"step": self.step, "tokens": self.tokens_seen, **untimed})
        if self.main and self.on_log:
            epoch = self.epoch + self.batch_in_epoch / self.train_data.batches_per_epoch(self.epoch)
            self.on_log(self.step, {**m, "tokens_seen": self.tokens_seen, "epoch": epoch})
        self.open_window()
        return m

    def evaluate(self) -> dict[str, float]:
        """Validation metrics now; a new best (lowest ``objective.best_metric``) is saved as best.pt."""
        metrics = validation_metrics(
            self.raw_model,
            self.objective,
            self.valid_data,
            self.device,
            self.autocast_dtype,
            self.cfg.eval_batches,
            self.world,
            batch_rows=self.cfg.batch_size,
        )
        self.last_val = metrics
        self.history.append({"step": self.step, "tokens": self.tokens_seen, **metrics})
        if self.main:
            if self.on_log:
                self.on_log(self.step, dict(metrics))
            if metrics[self.objective.best_metric] < self.best:
                self.best = metrics[self.objective.best_metric]
                ckpt_lib.save_checkpoint(self.best_path, self.checkpoint_state(False))
        return metrics

    # -- the loop ------------------------------------------------------------------------

    def fit(
        self, budget: Budget, *, stop_at_step: int | None = None, progress: bool = True, fresh: bool = True
    ) -> bool:
        """Train until the budget is spent (or ``stop_at_step``); returns whether it was spent.

        A checkpoint or evaluation also closes the logging window, so a resumed run logs exactly
        what an uninterrupted one does."""
        cfg, world = self.cfg, self.world
        self.budget = budget
        stream = self.train_data.train_stream(self.epoch, self.batch_in_epoch)
        if self.device.type == "cuda":
            stream = prefetch(stream, depth=4, pin=True)
        t0 = time.perf_counter()
        prior_seconds = self.elapsed
        self.start_step, self.start_tokens, self.t0 = self.step, self.tokens_seen, t0
        last_ckpt_step, last_ckpt_time = self.step, self.elapsed
        minute_snaps = [m for m in cfg.snapshot_minutes if m * 60 > self.elapsed]  # the ones not yet taken
        step_snaps = [s for s in cfg.snapshot_steps if s > self.step]
        h = self.history
        last_eval_step = h[-1]["step"] if h and self.objective.val_names[0] in h[-1] else -1
        self.open_window()
        lr = budget.lr(self.step, self.elapsed)
        steps = budget.total_steps is not None
        bar_total = budget.total_steps if steps else int(budget.seconds)
        bar = tqdm(
            total=bar_total,
            initial=self.step if steps else min(int(self.elapsed), bar_total),
            unit="step" if steps else "s",
            desc="pretrain",
            dynamic_ncols=True,
            mininterval=1.0,
            disable=not (progress and self.main),
        )
        clock = budget.seconds or cfg.checkpoint_minutes  # decisions taken on rank 0's clock
        clock_group = _cpu_group(world) if clock else None
        compiling = bool(cfg.compile)  # the first update of a session compiles the model
        self.model.train()
        try:
            while not budget.finished(self.step, self.elapsed) and not (
                stop_at_step is not None and self.step >= stop_at_step
            ):
                lr = budget.lr(self.step, self.elapsed)
                self.train_step(stream, lr)
                if compiling:  # the clock starts after compilation: time_minutes, train_seconds,
                    compiling = False  # throughput and MFU count training, not torch.compile
                    t0 = self.t0 = self.win_t0 = time.perf_counter()
                now = prior_seconds + time.perf_counter() - t0
                self.elapsed = _broadcast_float(now, self.device, world, clock_group) if clock else now

                step = self.step
                eval_due = self.valid_data is not None and cfg.eval_every and step % cfg.eval_every == 0
                ckpt_due = bool(
                    (cfg.checkpoint_every and step - last_ckpt_step >= cfg.checkpoint_every)
                    or (cfg.checkpoint_minutes and self.elapsed - last_ckpt_time >= cfg.checkpoint_minutes * 60)
                )
                end = budget.finished(step, self.elapsed) or step == stop_at_step
                if step % cfg.log_every == 0 or eval_due or ckpt_due or end:
                    m = self.close_window(lr)
                    bar.set_postfix(
                        loss=f"{m['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{m['tokens_per_s']:.0f}", refresh=False
                    )
                bar.update(1 if steps else min(int(self.elapsed), bar_total) - bar.n)
                if eval_due:
                    self.evaluate()
                    last_eval_step = step
                if ckpt_due:
                    self.save_last()
                    last_ckpt_step, last_ckpt_time = step, self.elapsed
                while step_snaps and step >= step_snaps[0]:
                    self.save_snapshot(step_snapshot_path(self.out_dir, step_snaps.pop(0)))
                while minute_snaps and self.elapsed >= minute_snaps[0] * 60:
                    self.save_snapshot(snapshot_path(self.out_dir, minute_snaps.pop(0)))
        finally:
            bar.close()
            if hasattr(stream, "close"):
                stream.close()

        completed = budget.finished(self.step, self.elapsed)
        final_eval = completed and self.valid_data is not None and last_eval_step != self.step
        if final_eval:
            self.evaluate()
        if self.step != last_ckpt_step or final_eval or fresh:
            self.save_last()
        if self.main:
            write_curves(self.history, self.curves_dir, self.objective)
        return completed

    def summary(self, completed: bool, flops_tok: float, precision: str) -> dict[str, Any]:
        """The run's final metrics (``reports/pretrain.json``): a function of the commit, params and
        data for a step or epoch budget; the times are :meth:`timings`'."""
        weights_sha = model_sha256(self.raw_model)
        if self.world > 1:  # DDP keeps replicas identical; prove it rather than assume it
            shas = [None] * self.world
            dist.all_gather_object(shas, weights_sha)
            if len(set(shas)) != 1:
                raise BertraceError(f"DDP ranks ended with different weights ({shas}); a bug: please report it")
        best = f"best_{self.objective.best_metric}"
        return {
            "step": self.step,
            "completed": completed,
            "tokens_seen": self.tokens_seen,
            "epochs": round(self.epoch + self.batch_in_epoch / self.train_data.batches_per_epoch(self.epoch), 4),
            **{k: v for k, v in self.train_metrics.items() if k != "tokens_per_s"},
            **self.last_val,
            best: None if self.best == math.inf else self.best,
            "num_parameters": num_parameters(self.raw_model),
            "model_sha256": weights_sha,
            "train_flops": float(flops_tok) * self.tokens_seen,
            "batch_size": self.cfg.batch_size,
            "world_size": self.world,
            "device": str(self.device),
            "precision": precision,
            "budget": self.budget.record(),
            "deterministic": self.cfg.deterministic,
            "num_threads": torch.get_num_threads(),
        }

    def timings(self, flops_tok: float, precision: str) -> dict[str, Any]:
        """This session's :data:`TIMINGS` (the run log's, never a DVC output): ``train_seconds`` (the
        whole run's for a wall-clock run, else this session's), throughput (a resume of a finished
        run, which trains no step: the whole training's average, when known) and MFU."""
        session_s = max(time.perf_counter() - self.t0, 1e-9)
        ran = self.step > self.start_step
        if ran:
            tokens_per_s = round((self.tokens_seen - self.start_tokens) / session_s, 1)
        else:
            tokens_per_s = round(self.tokens_seen / self.elapsed, 1) if self.elapsed > 0 else None
        return {
            "train_seconds": round(self.elapsed, 3),
            "tokens_per_s": tokens_per_s,
            "steps_per_s": round((self.step - self.start_step) / session_s, 3) if ran else None,
            "mfu": mfu(
                float(flops_tok) * (self.tokens_seen - self.start_tokens) / session_s,
                self.device,
                precision,
                self.world,
                tf32=self.cfg.tf32,
            ),
        }


# ----------------------------------------------------------------------------- entry point


def _init_checkpoint(cfg: PretrainConfig, tokenizer_sha: str, tokenizer_json: Path | None) -> dict[str, Any]:
    """``{model, model_config, provenance, record}`` of ``pretrain.init``: our checkpoint, or a published
    one (pipeline/interop/hf_import.py), checked to share the examples' vocabulary (same ids, same tokens)."""
    from pipeline.interop.hf_import import is_hf_source

    if is_hf_source(cfg.init):
        from pipeline.interop.hf_import import describe, import_checkpoint

        init = import_checkpoint(cfg.init, param="pretrain.init")
        record = {"path": str(cfg.init), "imported_from": describe(init["provenance"])}
    else:
        path = Path(cfg.init)
        if not path.is_file():
            raise BertraceError(
                f"params.yaml: pretrain.init {path}: not found; give a checkpoint (.pt) or a Hugging "
                "Face model directory / hub pointer file, or null for a random init"
            )
        init = ckpt_lib.load_checkpoint(path)
        if "model" not in init or "model_config" not in init:
            raise BertraceError(f"params.yaml: pretrain.init {path}: not a pre-training checkpoint (no model weights)")
        record = {"path": path.as_posix(), "sha256": sha256_file(path), "step": init.get("step")}
    init_sha = (init.get("provenance") or {}).get("tokenizer_sha256")
    if init_sha != tokenizer_sha:
        same_vocab = False
        if tokenizer_json is not None and "tokenizer_json" in init:
            from tokenizers import Tokenizer

            same_vocab = (
                Tokenizer.from_file(str(tokenizer_json)).get_vocab()
                == Tokenizer.from_str(init["tokenizer_json"]).get_vocab()
            )
        if not same_vocab:
            raise BertraceError(
                f"params.yaml: pretrain.init {cfg.init} was trained with another tokenizer (sha256 {init_sha}) than "
                f"the examples (sha256 {tokenizer_sha}): its token ids would mean other tokens. Continue pre-training "
                "on examples made with the checkpoint's own tokenizer, or set pretrain.init: null"
            )
    record["tokenizer_sha256"] = init_sha
    return {**init, "record": record}


LEGACY_VALUES = {
    "objective": "mlm_nsp",
    "embedding_init": EmbeddingInit(method="random").to_dict(),
    "mlm_nsp": {"nsp_weight": 1.0},
}


def _check_resumable(
    state: dict,
    last_path: Path,
    cfg: PretrainConfig,
    config,
    out_dir: Path,
    *,
    tokenizer_sha: str,
    manifest_sha: str,
    manifest_path: Path,
) -> None:
    """Raise BertraceError when ``state`` cannot be continued with the current data and params."""
    ckpt_lib.check_data_matches(
        state, last_path, tokenizer_sha256=tokenizer_sha, manifest_sha256=manifest_sha, manifest_path=manifest_path
    )
    if state["model_config"] != config.to_dict():
        diff = {
            k: (state["model_config"].get(k), v)
            for k, v in config.to_dict().items()
            if state["model_config"].get(k) != v
        }
        raise BertraceError(
            f"{last_path}: model config differs from params.yaml pretrain.model (checkpoint, now): {diff}; "
            f"delete {out_dir} to start over, or restore the params the checkpoint was trained with"
        )
    old, new = dict(state.get("train_config") or {}), cfg.to_dict()
    if old.get("objective") == "bert":  # named so before mlm_nsp / mlm; nsp_weight 0 was MLM only
        old["objective"] = "mlm" if old.pop("nsp_weight", 1.0) == 0 else "mlm_nsp"
    # for keys added since the checkpoint was written: the value they had before they existed (the
    # recipe was then BERT's from a random embedding), else today's default
    defaults = {**PretrainConfig().to_dict(), **LEGACY_VALUES}
    # an objective's own section (mlm_nsp, electra) matters only when that objective is trained
    unused = {k for k in OBJECTIVES if k in new and k != new["objective"]}
    changed = {
        k: (old.get(k, defaults.get(k)), new[k])
        for k in new
        if k not in RESUMABLE_CHANGES and k != "model" and k not in unused and old.get(k, defaults.get(k)) != new[k]
    }
    if changed:
        raise BertraceError(
            f"{last_path}: was trained with other pretrain params (checkpoint, now): {changed}; only the "
            f"budget, cadence and device settings may change on resume. Delete {out_dir} to start over "
            "with the new params, or restore the old ones"
        )


def pretrain(
    cfg: PretrainConfig,
    *,
    examples_dir: Path,
    out_dir: Path,
    provenance: dict,
    resume: bool | str = True,
    on_log: Callable[[int, dict], None] | None = None,
    progress: bool = True,
    tokenizer_json: Path | None = None,
    curves_dir: Path | None = None,
    stop_at_step: int | None = None,
) -> dict:
    """Pre-train on ``examples_dir`` with ``cfg.objective``; checkpoints ``out_dir/{last,best}.pt``.

    ``provenance`` (the stage's record: params, inputs, ...) is stored in every checkpoint, completed with the
    tokenizer and examples-manifest hashes, torch version, device, thread count, determinism
    and budget. ``resume`` continues from ``out_dir/last.pt`` when present (after checking it
    was trained on the same data and model config; ``resume="auto"`` starts over instead of
    failing when they differ, and when the budget differs: only ``resume=True`` extends a run). ``on_log(step, metrics)`` receives training metrics every
    ``log_every`` updates and validation metrics (``val_*``) after each evaluation.
    ``tokenizer_json`` is needed only for dynamic whole-word masking. Loss curves go to
    ``curves_dir`` (default ``out_dir``). ``stop_at_step`` ends the run early (after
    checkpointing) without changing the schedule, e.g. to train in chunks. Multi-process (DDP)
    when ``torch.distributed`` is initialised; only rank 0 writes files or calls ``on_log``.
    Returns the final metrics and this session's :data:`TIMINGS` in one dict (:func:`split_timings`
    parts them).
    """
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    if cfg.num_threads:
        torch.set_num_threads(int(cfg.num_threads))
    try:
        return _pretrain(
            cfg,
            examples_dir=Path(examples_dir),
            out_dir=Path(out_dir),
            provenance=provenance,
            resume=resume,
            on_log=on_log,
            progress=progress,
            tokenizer_json=tokenizer_json,
            curves_dir=Path(curves_dir) if curves_dir else Path(out_dir),
            stop_at_step=stop_at_step,
        )
    finally:  # process-wide settings: leave them as found
        torch.set_num_threads(threads)
        restore_deterministic(det)


def _resume_state(
    resume: bool | str,
    last_path: Path,
    cfg: PretrainConfig,
    config,
    out_dir: Path,
    device: torch.device,
    rank: int,
    world: int,
    **data_hashes,
) -> dict | None:
    """The ``last.pt`` state to continue, or None to start over: rank 0 decides and every rank
    gets its decision and its state.

    Only rank 0 writes ``last.pt``, so on nodes without a shared filesystem the other ranks have
    no copy, or a stale one: had each rank looked on its own disk, rank 0 would resume while the
    others started from step 0, their loops would differ in length and the collectives would
    hang until the NCCL timeout. So rank 0 reads and checks its file and broadcasts the verdict
    (an error is raised on every rank) and the file's bytes, which every rank loads
    ``weights_only``."""
    main = rank == 0
    state, error, payload = None, None, b""
    if main and resume and last_path.exists():
        try:
            state = ckpt_lib.load_checkpoint(last_path)
            _check_resumable(state, last_path, cfg, config, out_dir, **data_hashes)
            old = budget_of(state.get("train_config") or {})
            if resume == "auto" and old != budget_of(cfg.to_dict()):
                # A new budget is a new schedule: continuing the old run would give weights that a
                # fresh `dvc repro` of these params (no last.pt) never makes. Extending is opt-in.
                changed = {k: (v, getattr(cfg, k)) for k, v in old.items() if v != getattr(cfg, k)}
                raise BertraceError(
                    f"{last_path}: trained with another budget (checkpoint, now): {changed}; "
                    "resume: auto starts a run with a new budget over, so that its weights are "
                    "these params' (pretrain.resume: true extends the old run instead, and "
                    "the checkpoint says so)"
                )
        except BertraceError as why:
            if resume != "auto" or state is None:
                error = str(why)
            else:
                # `dvc repro` after a change upstream or in the recipe: a new run, not a resume.
                # The previous checkpoint stays in DVC's cache (it was committed when its run ended).
                print(f"pretrain: not resuming, starting over: {why}", flush=True)
            state = None
        if state is not None and world > 1:
            payload = last_path.read_bytes()
    if world > 1:
        on = device if dist.get_backend() == "nccl" else torch.device("cpu")
        box = [{"error": error, "nbytes": len(payload)}]
        dist.broadcast_object_list(box, src=0, device=on)
        error, nbytes = box[0]["error"], box[0]["nbytes"]
        if error is None and nbytes:
            buf = (
                torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(on)
                if main
                else torch.empty(nbytes, dtype=torch.uint8, device=on)
            )
            dist.broadcast(buf, src=0)
            if not main:
                state = torch.load(io.BytesIO(buf.cpu().numpy().tobytes()), map_location="cpu", weights_only=True)
            del buf
    if error is not None:
        raise BertraceError(error)
    return state


def _load_data(cfg: PretrainConfig, examples_dir: Path, tokenizer_json: Path | None, rank: int, world: int):
    """(manifest, its sha256, train data, valid data or None, per-rank micro-batch)."""
    manifest = load_manifest(examples_dir)
    manifest_path = examples_dir / "manifest.json"
    manifest_sha = sha256_file(manifest_path)
    is_cont = None
    if manifest["masking"] == "dynamic" and manifest.get("whole_word_masking"):
        if tokenizer_json is None:
            raise BertraceError(
                f"{manifest_path}: dynamic whole-word masking needs the tokenizer; "
                "pass tokenizer_json (data/tokenizer/tokenizer.json)"
            )
        if sha256_file(tokenizer_json) != manifest["tokenizer_sha256"]:
            raise BertraceError(
                f"{tokenizer_json}: sha256 differs from the tokenizer_sha256 in {manifest_path}; "
                "rerun the examples stage (dvc repro examples)"
            )
        is_cont = continuation_table(tokenizer_json)
    if cfg.batch_size % (cfg.grad_accum * world):
        raise BertraceError(
            f"params.yaml: pretrain.batch_size = {cfg.batch_size} must be a multiple of "
            f"grad_accum ({cfg.grad_accum}) x processes ({world})"
        )
    micro = cfg.batch_size // (cfg.grad_accum * world)
    train_data = PretrainingData(
        examples_dir,
        "train",
        batch_size=micro,
        seed=cfg.seed,
        rank=rank,
        world_size=world,
        shuffle_buffer=cfg.shuffle_buffer,
        is_continuation=is_cont,
    )
    valid_data = None
    if manifest["splits"].get("valid", {}).get("rows"):
        valid_data = PretrainingData(
            examples_dir, "valid", batch_size=micro, seed=cfg.seed, rank=rank, world_size=world, is_continuation=is_cont
        )
    return manifest, manifest_sha, train_data, valid_data, micro


def _pretrain(
    cfg: PretrainConfig,
    *,
    examples_dir: Path,
    out_dir: Path,
    provenance: dict,
    resume: bool | str,
    on_log,
    progress: bool,
    tokenizer_json: Path | None,
    curves_dir: Path,
    stop_at_step: int | None,
) -> dict:
    rank, world = _dist()
    main = rank == 0
    objective = make_objective(cfg)

    device = resolve_device(cfg.device)
    determinism = set_deterministic(cfg.deterministic, device)  # before the first CUDA kernel
    autocast_dtype, use_scaler = resolve_precision(cfg.precision, device)
    if device.type == "cuda":  # TF32 matmuls on Ampere+ (a process-wide setting)
        torch.set_float32_matmul_precision("high" if cfg.tf32 else "highest")
    precision = precision_name(autocast_dtype)

    objective.prepare(load_manifest(examples_dir), examples_dir)  # shards of its kind (examples.mode)?
    manifest, manifest_sha, train_data, valid_data, micro = _load_data(cfg, examples_dir, tokenizer_json, rank, world)
    manifest_path = examples_dir / "manifest.json"
    tokenizer_sha = manifest["tokenizer_sha256"]
    config = objective.model_config(config_from_params(cfg.model, vocab_size=int(manifest["vocab_size"])))
    init = _init_checkpoint(cfg, tokenizer_sha, tokenizer_json) if cfg.init else None
    if init is not None:
        given = cfg.model.overrides()
        drop = {k: given[k] for k in ("dropout", "attention_dropout") if k in given}
        config = objective.model_config(BertConfig.from_dict({**init["model_config"], **drop}))
    if manifest["max_seq_len"] > config.max_position:
        raise BertraceError(
            f"{manifest_path}: max_seq_len {manifest['max_seq_len']} exceeds the model's max_position "
            f"{config.max_position}; raise pretrain.model.max_position or lower examples.max_seq_len"
        )
    provenance = json.loads(
        canonical_json(
            {
                **provenance,
                "tokenizer_sha256": tokenizer_sha,
                "examples_manifest_sha256": manifest_sha,
                "torch": torch.__version__,
                "device": str(device),
                "precision": precision,
                "world_size": world,
                "determinism": determinism,
                "objective": cfg.objective,
                **({"init": init["record"]} if init else {}),
                "arithmetic": arithmetic_state(device, precision, threads_fixed=bool(cfg.num_threads)),
            }
        )
    )
    if init is not None and init["provenance"].get("stage") == "imported":  # trace: "imported from ..." at the root
        provenance["upstream"] = {**(provenance.get("upstream") or {}), "imported": init["provenance"]}

    last_path, best_path = out_dir / ckpt_lib.LAST, out_dir / ckpt_lib.BEST
    state = _resume_state(
        resume,
        last_path,
        cfg,
        config,
        out_dir,
        device,
        rank,
        world,
        tokenizer_sha=tokenizer_sha,
        manifest_sha=manifest_sha,
        manifest_path=manifest_path,
    )
    if main:
        ckpt_lib.remove_stale_temporaries(out_dir)  # left by a run killed while writing
        ckpt_lib.remove_stale_temporaries(curves_dir, (TRAIN_CURVE, VAL_CURVE))
        if state is None:  # a fresh run: the old best.pt and snapshots belong to another run
            snaps = out_dir / "snapshots"
            for old in [best_path, *sorted(snaps.glob("minute-*.pt")), *sorted(snaps.glob("step-*.pt"))]:
                old.unlink(missing_ok=True)

    torch.manual_seed(cfg.seed)  # identical initialisation on every rank
    random.seed(cfg.seed)  # unused by training, but saved in last.pt: seeded, so the file is the same too
    np.random.seed(cfg.seed)
    model = objective.build_model(config)
    if init is not None and state is None:  # a resumed run continues its own weights
        try:
            model.load_state_dict(init["model"])
        except RuntimeError as e:
            raise BertraceError(
                f"params.yaml: pretrain.init {cfg.init}: its weights do not fit the "
                f"{type(model).__name__} of objective {cfg.objective} ({str(e).splitlines()[0][:300]} "
                "...); continue pre-training with the objective it was trained with"
            ) from None
    if cfg.embedding_init.method != "random" and init is not None:
        raise BertraceError(
            "params.yaml: pretrain.embedding_init.method is skipgram but pretrain.init starts from "
            "trained weights; set one of them (embedding_init.method: random to continue pre-training)"
        )
    embedding_record = (state.get("provenance") or {}).get("embedding_init") if state is not None else None
    timings = {}
    if cfg.embedding_init.method != "random" and init is None and state is None:  # a resume has its weights
        start = time.perf_counter()
        embedding_record = initialise_embedding(
            model, examples_dir, manifest, cfg.embedding_init, std=config.initializer_range, progress=progress and main
        )
        timings["embedding_init_seconds"] = round(time.perf_counter() - start, 1)  # before the first update
    if embedding_record is not None:
        provenance = {**provenance, "embedding_init": embedding_record}
    model = model.to(device)
    trainer = Trainer(
        cfg,
        objective,
        model=model,
        config=config,
        train_data=train_data,
        valid_data=valid_data,
        device=device,
        autocast_dtype=autocast_dtype,
        use_scaler=use_scaler,
        world=world,
        rank=rank,
        micro=micro,
        out_dir=out_dir,
        curves_dir=curves_dir,
        provenance=provenance,
        on_log=on_log,
    )
    if state is not None:
        trainer.restore(state)
    else:
        torch.manual_seed(cfg.seed + rank)  # dropout differs across ranks
    if world > 1:
        trainer.model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if cfg.compile:
        # dynamic: batches differ in length and masked count from the first one on; static
        # shapes would recompile (tens of seconds) as soon as the second batch arrives
        trainer.model = torch.compile(trainer.model, dynamic=True)

    budget = Budget(cfg, train_data, extends=extended_budgets(state, cfg) if state is not None else None)
    trainer.provenance = provenance = {**provenance, "budget": budget.record()}
    try:
        completed = trainer.fit(budget, stop_at_step=stop_at_step, progress=progress, fresh=state is None)
    except RuntimeError as e:
        if cfg.deterministic and "deterministic" in str(e):
            raise BertraceError(
                f"pretrain.deterministic: {e}\nThis operation has no deterministic kernel on "
                f"{device}; set pretrain.deterministic: false in params.yaml to run it (the "
                "run is then not bit-reproducible)"
            ) from None
        raise
    flops_tok = objective.flops_per_token(config, manifest)
    return {**trainer.summary(completed, flops_tok, precision), **trainer.timings(flops_tok, precision), **timings}
