"""BERT pre-training loop: MLM + NSP, AdamW, linear warmup/decay, AMP, DDP, exact resume.

The recipe is Google's ``run_pretraining.py`` / ``optimization.py`` (Devlin et al. 2019,
appendix A.2): AdamW with decoupled weight decay 0.01 (none on biases and LayerNorm),
``eps=1e-6``, gradient clipping at global norm 1.0, linear warmup then linear decay to 0.
Two deliberate differences:

* the decay starts at the end of warmup (Google decays from step 0 and overrides the first
  steps with the ramp, so its peak is ``lr * (1 - warmup/total)``); and
* the learning rate is a pure *function* of ``(step, budget)`` evaluated at every update,
  never a stateful scheduler: resuming with a larger budget stretches the schedule instead of
  pinning the rate at 0. With a wall-clock budget (``time_minutes``) the schedule follows
  elapsed time, as in cramming (Geiping & Goldstein 2022, section 3): progress is
  ``elapsed / budget`` and training stops when the budget is spent.

``batch_size`` is the *global* batch: examples per optimizer update over all ranks and
accumulation steps, so a change of world size keeps the optimisation the same. Each rank
reads ``batch_size / (grad_accum * world_size)`` examples per micro-batch.

Exact resume: a checkpoint holds the model, optimizer and scaler states, every rank's RNG
states and the data position ``(epoch, batches consumed)``; the loader replays its shuffle
from that position, so an interrupted run continues bit-for-bit like an uninterrupted one
(same device, precision and world size).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from pipeline import checkpoint as ckpt_lib
from pipeline.errors import BertraceError
from pipeline.io import atomic_open, canonical_json, sha256_file
from pipeline.model import (
    BertForPreTraining,
    config_from_params,
    flops_per_token,
    num_parameters,
    param_groups,
    pretraining_loss,
)
from pipeline.pretrain_data import PretrainingData, continuation_table, load_manifest, prefetch

# Keys a resumed run may change: the budget (to extend the schedule), cadence and hardware.
# Any other change would silently mix two recipes in one checkpoint.
RESUMABLE_CHANGES = ("max_steps", "epochs", "time_minutes", "eval_every", "eval_batches", "log_every",
                     "checkpoint_every", "checkpoint_minutes", "snapshot_minutes", "device", "precision", "tf32",
                     "compile", "num_threads")
TRAIN_CURVE = "pretrain_loss.csv"
VAL_CURVE = "pretrain_val.csv"
TRAIN_COLUMNS = ("step", "tokens", "seconds", "lr", "loss", "mlm_loss", "nsp_loss", "grad_norm", "tokens_per_s")
VAL_COLUMNS = ("step", "tokens", "seconds", "val_loss", "val_mlm_loss", "val_mlm_acc", "val_nsp_loss",
               "val_nsp_acc", "val_perplexity")


@dataclass
class PretrainConfig:
    """The ``pretrain`` section of params.yaml."""

    model: dict = field(default_factory=lambda: {"preset": "mini"})  # preset + BertConfig overrides
    batch_size: int = 64  # examples per optimizer update, all ranks and accumulation steps together
    grad_accum: int = 1  # micro-batches per update
    lr: float = 5e-4  # peak learning rate
    warmup: float = 0.06  # < 1: fraction of the budget; >= 1: number of updates
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    clip_grad_norm: float = 1.0  # 0 disables clipping
    nsp_weight: float = 1.0  # loss = MLM + nsp_weight * NSP; BERT 1.0, 0.0 = MLM only (RoBERTa)
    # budget: exactly one of these
    max_steps: int | None = None  # optimizer updates
    epochs: float | None = None  # passes over the training shards (may be fractional)
    time_minutes: float | None = None  # wall clock; the lr schedule follows elapsed time
    eval_every: int = 500  # updates between validations (0: only at the end)
    eval_batches: int | None = None  # validation batches per evaluation (None/0: the whole split)
    log_every: int = 20  # updates between training-metric logs
    checkpoint_every: int | None = 1000  # updates between checkpoints (None/0: off)
    checkpoint_minutes: float | None = 10.0  # and/or minutes between checkpoints (None/0: off)
    snapshot_minutes: list = field(default_factory=list)  # keep the weights at these elapsed minutes
                                                          # (snapshots/minute-015.pt …; learning curves)
    shuffle_buffer: int = 10_000  # examples in each rank's shuffle buffer
    seed: int = 0
    device: str = "auto"  # auto (cuda -> mps -> cpu) | cpu | cuda | cuda:N | mps
    precision: str = "auto"  # auto (bf16 if supported else fp16 on CUDA; fp32 otherwise) | fp32 | bf16 | fp16
    tf32: bool = True  # TensorFloat-32 matmuls on Ampere+ GPUs
    compile: bool = False  # torch.compile the model
    num_threads: int = 0  # torch CPU threads (0: torch's default)

    def __post_init__(self):
        def bad(name, why):
            raise BertraceError(f"params.yaml: pretrain.{name} = {getattr(self, name)!r}: {why}")

        # YAML 1.1 reads "5e-4" as a string: coerce numbers, with a clear error when impossible.
        for name, kind in (("lr", float), ("warmup", float), ("weight_decay", float), ("eps", float),
                           ("clip_grad_norm", float), ("nsp_weight", float), ("epochs", float),
                           ("time_minutes", float), ("checkpoint_minutes", float), ("batch_size", int),
                           ("grad_accum", int), ("max_steps", int), ("eval_every", int), ("eval_batches", int),
                           ("log_every", int), ("checkpoint_every", int), ("shuffle_buffer", int), ("seed", int),
                           ("num_threads", int)):
            value = getattr(self, name)
            if value is None or isinstance(value, bool):
                continue
            try:
                number = float(value)
                if kind is int and number != int(number):
                    raise ValueError
                setattr(self, name, kind(number) if kind is float else int(number))
            except (TypeError, ValueError):
                bad(name, f"must be {'an integer' if kind is int else 'a number'}")
        try:
            betas = tuple(float(b) for b in self.betas)
        except (TypeError, ValueError):
            betas = ()
        if len(betas) != 2:
            bad("betas", "must be two numbers, e.g. [0.9, 0.999]")
        self.betas = betas
        try:
            self.snapshot_minutes = sorted(float(m) for m in (self.snapshot_minutes or []))
        except (TypeError, ValueError):
            bad("snapshot_minutes", "must be a list of minutes, e.g. [15, 30]")
        if any(m <= 0 for m in self.snapshot_minutes):
            bad("snapshot_minutes", "must be > 0")
        budgets = [n for n in ("max_steps", "epochs", "time_minutes") if getattr(self, n) not in (None, 0)]
        if len(budgets) != 1:
            raise BertraceError(
                "params.yaml: pretrain needs exactly one budget: max_steps, epochs or time_minutes "
                f"(got {budgets or 'none'}); set the others to null")
        if not isinstance(self.model, dict):
            bad("model", "must be a mapping with a 'preset' (tiny|mini|small|medium|base|large) and overrides")
        for name in ("batch_size", "grad_accum"):
            if int(getattr(self, name)) < 1:
                bad(name, "must be >= 1")
        if self.batch_size % self.grad_accum:
            bad("batch_size", f"must be a multiple of grad_accum ({self.grad_accum})")
        if self.lr <= 0:
            bad("lr", "must be > 0")
        if self.nsp_weight < 0:
            bad("nsp_weight", "must be >= 0 (1.0: BERT's MLM + NSP; 0.0: MLM only)")
        if self.warmup < 0:
            bad("warmup", "must be >= 0 (a fraction < 1 of the budget, or a number of steps)")
        if self.time_minutes and self.warmup >= 1:
            bad("warmup", "with a time_minutes budget give warmup as a fraction of the budget (e.g. 0.06)")
        if self.log_every < 1:
            bad("log_every", "must be >= 1")
        if self.precision not in ("auto", "fp32", "bf16", "fp16"):
            bad("precision", "must be auto, fp32, bf16 or fp16")
        for name in ("max_steps", "epochs", "time_minutes"):
            v = getattr(self, name)
            if v is not None and v < 0:
                bad(name, "must be > 0")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "PretrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise BertraceError(f"params.yaml: unknown pretrain keys {unknown}; valid keys: {sorted(known)}")
        return cls(**params)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(canonical_json(asdict(self)))


# ----------------------------------------------------------------------------- schedule


def snapshot_path(out_dir: str | Path, minute: float) -> Path:
    """Where ``pretrain.snapshot_minutes`` keeps the weights at ``minute``: snapshots/minute-015.pt."""
    label = f"{int(minute):03d}" if minute == int(minute) else f"{minute:07.3f}".rstrip("0")
    return Path(out_dir) / "snapshots" / f"minute-{label}.pt"


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


# ----------------------------------------------------------------------------- device


def resolve_device(name: str, param: str = "pretrain.device") -> torch.device:
    """``auto`` is cuda → mps → cpu; anything else must name a device torch can use (``param``
    is the params.yaml key the name came from, for the error message)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise BertraceError(f"params.yaml: {param} = {name!r} is not a device (auto, cpu, cuda, cuda:N, mps)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BertraceError(f"params.yaml: {param} asks for CUDA but torch sees no GPU; use device: auto")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise BertraceError(f"params.yaml: {param} asks for MPS but it is not available; use device: auto")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_precision(name: str, device: torch.device) -> tuple[torch.dtype | None, bool]:
    """``(autocast dtype or None for fp32, use a GradScaler)``."""
    if name == "auto":
        if device.type != "cuda":
            return None, False
        name = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if name == "fp32":
        return None, False
    if name == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise BertraceError("params.yaml: pretrain.precision = bf16, but this GPU lacks bf16; use auto or fp16")
        if device.type not in ("cuda", "cpu"):
            raise BertraceError(f"params.yaml: pretrain.precision = bf16 is not supported on {device.type}; use fp32")
        return torch.bfloat16, False
    if device.type != "cuda":
        raise BertraceError(f"params.yaml: pretrain.precision = fp16 needs a CUDA GPU (device is {device}); use auto")
    return torch.float16, True


# Dense peak FLOP/s per GPU for model-FLOPs utilisation (vendor datasheets, no sparsity).
PEAK_FLOPS = {"H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
              "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
              "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
              "L4": {"bf16": 121e12, "fp16": 121e12, "fp32": 30e12}}


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Dense peak FLOP/s of ``device`` at ``precision`` (fp32 | bf16 | fp16) from PEAK_FLOPS; None if unknown."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((p.get(precision) for key, p in PEAK_FLOPS.items() if key in name), None)


def _mfu(flops_per_s: float, device: torch.device, precision: str, world: int) -> float | None:
    """Model FLOPs utilisation (PaLM, Chowdhery et al. 2022, app. B) on a known GPU, else None."""
    peak = peak_flops(device, precision)
    return round(flops_per_s / (peak * world), 4) if peak else None


# ----------------------------------------------------------------------------- distributed


def _dist() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce(t: torch.Tensor, world: int) -> torch.Tensor:
    if world > 1:
        dist.all_reduce(t)
    return t


def _broadcast_float(value: float, device: torch.device, world: int) -> float:
    """Rank 0's value on every rank (clocks differ; decisions must not)."""
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return float(t.item())


def _gather_rng(world: int, rank: int) -> list[dict] | None:
    state = ckpt_lib.rng_state()
    if world == 1:
        return [state]
    out = [None] * world if rank == 0 else None
    dist.gather_object(state, out, dst=0)
    return out


# ----------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: PretrainingData, device: torch.device, autocast_dtype,
             max_batches: int | None = None, world: int = 1, nsp_weight: float = 1.0) -> dict[str, float]:
    """Validation MLM/NSP loss and accuracy (means over masked tokens / examples, all ranks);
    ``val_loss`` is the training objective, MLM + ``nsp_weight`` * NSP."""
    was_training = model.training
    model.eval()
    # mlm loss sum, mlm correct, mlm count, nsp loss sum, nsp correct, nsp count
    sums = torch.zeros(6, dtype=torch.float64, device=device)
    for batch in data.eval_batches(max_batches or None):
        batch = batch.to(device)
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask, batch.masked_positions)
        mlm, nsp = out.mlm_logits.float(), out.nsp_logits.float()
        sums += torch.stack([t.double() for t in (
            F.cross_entropy(mlm, batch.masked_lm_labels, reduction="sum"),
            (mlm.argmax(-1) == batch.masked_lm_labels).sum(),
            torch.tensor(batch.masked_lm_labels.numel(), device=device),
            F.cross_entropy(nsp, batch.next_sentence_labels, reduction="sum"),
            (nsp.argmax(-1) == batch.next_sentence_labels).sum(),
            torch.tensor(batch.size, device=device),
        )])
    _all_reduce(sums, world)
    model.train(was_training)
    s = sums.tolist()
    if s[2] == 0:
        raise BertraceError("validation split produced no masked tokens; check data/examples/valid shards")
    mlm_loss, nsp_loss = s[0] / s[2], s[3] / s[5]
    return {
        "val_loss": mlm_loss + nsp_weight * nsp_loss,
        "val_mlm_loss": mlm_loss,
        "val_mlm_acc": s[1] / s[2],
        "val_nsp_loss": nsp_loss,
        "val_nsp_acc": s[4] / s[5],
        "val_perplexity": math.exp(min(mlm_loss, 700.0)),
    }


def model_sha256(model: torch.nn.Module) -> str:
    """sha256 over the state dict's names, dtypes, shapes and bytes (identifies the weights)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------- curves


def write_curves(history: list[dict], out_dir: Path) -> tuple[Path, Path]:
    """Training and validation curves as CSV (DVC plots): one row per log / evaluation."""
    paths = []
    for name, columns, key in ((TRAIN_CURVE, TRAIN_COLUMNS, "loss"), (VAL_CURVE, VAL_COLUMNS, "val_loss")):
        path = out_dir / name
        with atomic_open(path, "w") as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
            w.writeheader()
            for row in history:
                if key in row:
                    w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
        paths.append(path)
    return paths[0], paths[1]


# ----------------------------------------------------------------------------- the loop


def _budget_steps(cfg: PretrainConfig, data: PretrainingData) -> int | None:
    """Total optimizer updates of a step/epoch budget (None for a time budget)."""
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


def _check_resumable(state: dict, last_path: Path, cfg: "PretrainConfig", config, out_dir: Path, *,
                     tokenizer_sha: str, manifest_sha: str, manifest_path: Path) -> None:
    """Raise BertraceError when ``state`` cannot be continued with the current data and params."""
    ckpt_lib.check_data_matches(state, last_path, tokenizer_sha256=tokenizer_sha,
                                manifest_sha256=manifest_sha, manifest_path=manifest_path)
    if state["model_config"] != config.to_dict():
        diff = {k: (state["model_config"].get(k), v) for k, v in config.to_dict().items()
                if state["model_config"].get(k) != v}
        raise BertraceError(
            f"{last_path}: model config differs from params.yaml pretrain.model (checkpoint, now): {diff}; "
            f"delete {out_dir} to start over, or restore the params the checkpoint was trained with")
    old, new = state.get("train_config") or {}, cfg.to_dict()
    changed = {k: (old.get(k), new[k]) for k in new if k not in RESUMABLE_CHANGES and k != "model"
               and old.get(k) != new[k]}
    if changed:
        raise BertraceError(
            f"{last_path}: was trained with other pretrain params (checkpoint, now): {changed}; only the "
            f"budget, cadence and device settings may change on resume. Delete {out_dir} to start over "
            "with the new params, or restore the old ones")


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
    """Pre-train BERT on ``examples_dir``; checkpoints ``out_dir/{last,best}.pt``.

    ``provenance`` (git state, params, ...) is stored in every checkpoint, completed with the
    tokenizer and examples-manifest hashes, torch version and device. ``resume`` continues
    from ``out_dir/last.pt`` when present (after checking it was trained on the same data and
    model config; ``resume="auto"`` starts over instead of failing when they differ).
    ``on_log(step, metrics)`` receives training metrics every ``log_every``
    updates and validation metrics (``val_*``) after each evaluation. ``tokenizer_json`` is
    needed only for dynamic whole-word masking. Loss curves go to ``curves_dir`` (default
    ``out_dir``). ``stop_at_step`` ends the run early (after checkpointing) without changing
    the schedule, e.g. to train in chunks. Multi-process (DDP) when ``torch.distributed`` is
    initialised; only rank 0 writes files or calls ``on_log``. Returns the final metrics.
    """
    threads = torch.get_num_threads()
    if cfg.num_threads:
        torch.set_num_threads(int(cfg.num_threads))
    try:
        return _pretrain(cfg, examples_dir=Path(examples_dir), out_dir=Path(out_dir), provenance=provenance,
                         resume=resume, on_log=on_log, progress=progress, tokenizer_json=tokenizer_json,
                         curves_dir=Path(curves_dir) if curves_dir else Path(out_dir), stop_at_step=stop_at_step)
    finally:
        torch.set_num_threads(threads)  # a process-wide setting: leave it as found


def _pretrain(cfg: PretrainConfig, *, examples_dir: Path, out_dir: Path, provenance: dict, resume: bool,
              on_log, progress: bool, tokenizer_json: Path | None, curves_dir: Path,
              stop_at_step: int | None) -> dict:
    rank, world = _dist()
    main = rank == 0

    device = resolve_device(cfg.device)
    autocast_dtype, use_scaler = resolve_precision(cfg.precision, device)
    if device.type == "cuda":  # TF32 matmuls on Ampere+ (a process-wide setting)
        torch.set_float32_matmul_precision("high" if cfg.tf32 else "highest")
    precision = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[autocast_dtype]

    # -- data ---------------------------------------------------------------------------
    manifest = load_manifest(examples_dir)
    manifest_path = examples_dir / "manifest.json"
    manifest_sha = sha256_file(manifest_path)
    tokenizer_sha = manifest["tokenizer_sha256"]
    is_cont = None
    if manifest["masking"] == "dynamic" and manifest.get("whole_word_masking"):
        if tokenizer_json is None:
            raise BertraceError(f"{manifest_path}: dynamic whole-word masking needs the tokenizer; "
                                "pass tokenizer_json (data/tokenizer/tokenizer.json)")
        if sha256_file(tokenizer_json) != tokenizer_sha:
            raise BertraceError(f"{tokenizer_json}: sha256 differs from the tokenizer_sha256 in {manifest_path}; "
                                "rerun the examples stage (dvc repro examples)")
        is_cont = continuation_table(tokenizer_json)
    if cfg.batch_size % (cfg.grad_accum * world):
        raise BertraceError(f"params.yaml: pretrain.batch_size = {cfg.batch_size} must be a multiple of "
                            f"grad_accum ({cfg.grad_accum}) x processes ({world})")
    micro = cfg.batch_size // (cfg.grad_accum * world)
    train_data = PretrainingData(examples_dir, "train", batch_size=micro, seed=cfg.seed, rank=rank,
                                 world_size=world, shuffle_buffer=cfg.shuffle_buffer, is_continuation=is_cont)
    valid_data = None
    if manifest["splits"].get("valid", {}).get("rows"):
        valid_data = PretrainingData(examples_dir, "valid", batch_size=micro, seed=cfg.seed, rank=rank,
                                     world_size=world, is_continuation=is_cont)

    # -- model --------------------------------------------------------------------------
    config = config_from_params(dict(cfg.model), vocab_size=int(manifest["vocab_size"]))
    if manifest["max_seq_len"] > config.max_position:
        raise BertraceError(
            f"{manifest_path}: max_seq_len {manifest['max_seq_len']} exceeds the model's max_position "
            f"{config.max_position}; raise pretrain.model.max_position or lower examples.max_seq_len")
    provenance = json.loads(canonical_json({
        **provenance, "tokenizer_sha256": tokenizer_sha, "examples_manifest_sha256": manifest_sha,
        "torch": torch.__version__, "device": str(device), "precision": precision, "world_size": world,
    }))

    last_path, best_path = out_dir / ckpt_lib.LAST, out_dir / ckpt_lib.BEST
    state = None
    if resume and last_path.exists():
        state = ckpt_lib.load_checkpoint(last_path)
        try:
            _check_resumable(state, last_path, cfg, config, out_dir, tokenizer_sha=tokenizer_sha,
                             manifest_sha=manifest_sha, manifest_path=manifest_path)
        except BertraceError as why:
            if resume != "auto":
                raise
            # `dvc repro` after a change upstream or in the recipe: a new run, not a resume.
            # The previous checkpoint stays in DVC's cache (it was committed when its run ended).
            if main:
                print(f"pretrain: not resuming, starting over: {why}", flush=True)
            state = None
    if main:
        ckpt_lib.remove_stale_temporaries(out_dir)  # left by a run killed while writing
        ckpt_lib.remove_stale_temporaries(curves_dir, (TRAIN_CURVE, VAL_CURVE))
        if state is None:  # a fresh run: the old best.pt and snapshots belong to another run
            for old in [best_path, *sorted((out_dir / "snapshots").glob("minute-*.pt"))]:
                old.unlink(missing_ok=True)

    torch.manual_seed(cfg.seed)  # identical initialisation on every rank
    model = BertForPreTraining(config).to(device)
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas),
                                  eps=cfg.eps, **({"fused": True} if device.type == "cuda" else {}))
    scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)

    step, tokens_seen, prior_seconds = 0, 0, 0.0
    epoch, batch_in_epoch = 0, 0
    best = math.inf
    history: list[dict] = []
    last_val: dict[str, float] = {}
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if use_scaler and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        step, tokens_seen, prior_seconds = state["step"], state["tokens_seen"], state["train_seconds"]
        pos = state["data_position"]
        epoch, batch_in_epoch = pos["epoch"], pos["batch"]
        if (pos["world_size"], pos["micro_batch"]) != (world, micro):  # same examples consumed, roughly
            batch_in_epoch = pos["batch"] * pos["world_size"] * pos["micro_batch"] // (world * micro)
        best = state.get("best_val_mlm_loss") or math.inf
        if best_path.exists():
            best = min(best, ckpt_lib.load_checkpoint(best_path).get("best_val_mlm_loss") or math.inf)
        history = list(state.get("history", []))
        last_val = dict(state.get("metrics") or {})
        rngs = state["rng"]
        if len(rngs) == world:
            ckpt_lib.set_rng_state(rngs[rank])
        else:
            torch.manual_seed(cfg.seed + 1000 * step + rank)
    else:
        torch.manual_seed(cfg.seed + rank)  # dropout differs across ranks
    raw_model = model
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        model = torch.compile(model)

    total_steps = _budget_steps(cfg, train_data)
    budget_s = cfg.time_minutes * 60.0 if cfg.time_minutes else None
    warmup_steps = warmup_steps_for(cfg.warmup, total_steps) if total_steps else 0

    def lr_now(elapsed: float) -> float:
        if total_steps is not None:
            return lr_at_step(step, peak=cfg.lr, warmup_steps=warmup_steps, total_steps=total_steps)
        return lr_at_progress(min(elapsed / budget_s, 1.0), peak=cfg.lr, warmup_fraction=cfg.warmup)

    def finished(elapsed: float) -> bool:
        return step >= total_steps if total_steps is not None else elapsed >= budget_s

    n_params = num_parameters(raw_model)
    mean_len = manifest["splits"]["train"]["tokens"] / max(manifest["splits"]["train"]["rows"], 1)
    mlm_fraction = manifest["splits"]["train"].get("masked_fraction", manifest.get("masked_lm_prob", 0.15))
    flops_tok = flops_per_token(config, int(round(mean_len)), mlm_fraction=mlm_fraction)

    def checkpoint_state(full: bool) -> dict[str, Any]:
        s = {
            "model": raw_model.state_dict(),
            "model_config": config.to_dict(),
            "train_config": cfg.to_dict(),
            "step": step, "tokens_seen": tokens_seen, "train_seconds": elapsed,
            "best_val_mlm_loss": None if best == math.inf else best,
            "metrics": dict(last_val), "provenance": provenance,
        }
        if full:
            s.update({
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict() if use_scaler else {},
                "data_position": {"epoch": epoch, "batch": batch_in_epoch, "world_size": world, "micro_batch": micro},
                "history": history,
            })
        return s

    def save_last():
        rngs = _gather_rng(world, rank)  # a collective: every rank takes part
        if main:
            ckpt_lib.save_checkpoint(last_path, {**checkpoint_state(True), "rng": rngs})
            write_curves(history, curves_dir)

    def run_eval() -> dict[str, float]:
        nonlocal best, last_val
        metrics = evaluate(raw_model, valid_data, device, autocast_dtype, cfg.eval_batches, world,
                           nsp_weight=cfg.nsp_weight)
        last_val = metrics
        history.append({"step": step, "tokens": tokens_seen, "seconds": round(elapsed, 3), **metrics})
        if main:
            if on_log:
                on_log(step, dict(metrics))
            if metrics["val_mlm_loss"] < best:
                best = metrics["val_mlm_loss"]
                ckpt_lib.save_checkpoint(best_path, checkpoint_state(False))
        return metrics

    # -- training -----------------------------------------------------------------------
    stream = train_data.train_stream(epoch, batch_in_epoch)
    if device.type == "cuda":
        stream = prefetch(stream, depth=4, pin=True)
    t0 = time.perf_counter()
    elapsed = prior_seconds
    start_step, start_tokens = step, tokens_seen
    last_ckpt_step, last_ckpt_time = step, elapsed
    snapshots = [m for m in cfg.snapshot_minutes if m * 60 > elapsed]  # the ones not yet taken
    last_eval_step = history[-1]["step"] if history and "val_loss" in history[-1] else -1
    win = torch.zeros(4, dtype=torch.float64, device=device)  # loss, mlm, nsp, grad_norm sums
    win_tokens, win_steps, win_t0 = 0, 0, time.perf_counter()
    lr = lr_now(elapsed)
    train_metrics: dict[str, float] = {}
    bar_total = total_steps if total_steps is not None else int(budget_s)
    bar = tqdm(total=bar_total, initial=step if total_steps is not None else min(int(elapsed), bar_total),
               unit="step" if total_steps is not None else "s", desc="pretrain", dynamic_ncols=True, mininterval=1.0,
               disable=not (progress and main))
    model.train()
    try:
        while not finished(elapsed) and not (stop_at_step is not None and step >= stop_at_step):
            lr = lr_now(elapsed)
            for group in optimizer.param_groups:
                group["lr"] = lr
            for k in range(cfg.grad_accum):
                epoch, i, batch = next(stream)
                batch_in_epoch = i + 1
                win_tokens += batch.num_tokens  # counted on the host: no device sync
                batch = batch.to(device, non_blocking=True)
                sync = k == cfg.grad_accum - 1 or world == 1
                with (contextlib.nullcontext() if sync else model.no_sync()):
                    with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                                        enabled=autocast_dtype is not None):
                        out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask,
                                    batch.masked_positions)
                        loss, mlm_loss, nsp_loss = pretraining_loss(out, batch.masked_lm_labels,
                                                                    batch.next_sentence_labels, cfg.nsp_weight)
                    scaler.scale(loss / cfg.grad_accum).backward()
                win[:3] += torch.stack([loss.detach(), mlm_loss.detach(), nsp_loss.detach()]).double() / cfg.grad_accum
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(),
                                                       cfg.clip_grad_norm if cfg.clip_grad_norm else math.inf)
            win[3] += grad_norm.double()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            win_steps += 1
            now = prior_seconds + time.perf_counter() - t0
            elapsed = _broadcast_float(now, device, world) if (budget_s or cfg.checkpoint_minutes) else now

            # A checkpoint or evaluation also closes the logging window, so a resumed run logs
            # exactly what an uninterrupted one does.
            eval_due = valid_data is not None and cfg.eval_every and step % cfg.eval_every == 0
            ckpt_due = bool((cfg.checkpoint_every and step - last_ckpt_step >= cfg.checkpoint_every)
                            or (cfg.checkpoint_minutes and elapsed - last_ckpt_time >= cfg.checkpoint_minutes * 60))
            end = finished(elapsed) or step == stop_at_step
            if step % cfg.log_every == 0 or eval_due or ckpt_due or end:
                stats = torch.cat([win, torch.tensor([win_tokens], dtype=torch.float64, device=device)])
                _all_reduce(stats, world)
                s = stats.tolist()
                tokens_seen += int(s[4])
                dt = max(time.perf_counter() - win_t0, 1e-9)
                n = win_steps * world
                train_metrics = {"loss": s[0] / n, "mlm_loss": s[1] / n, "nsp_loss": s[2] / n, "lr": lr,
                                 "grad_norm": s[3] / n, "tokens_per_s": s[4] / dt}
                if not math.isfinite(train_metrics["loss"]):
                    raise BertraceError(
                        f"pre-training diverged: loss is {train_metrics['loss']} at step {step}; lower "
                        "pretrain.lr, raise pretrain.warmup or use precision: fp32/bf16, then delete "
                        f"{out_dir} and rerun")
                history.append({"step": step, "tokens": tokens_seen, "seconds": round(elapsed, 3), **train_metrics})
                if main and on_log:
                    on_log(step, {**train_metrics, "tokens_seen": tokens_seen,
                                  "epoch": epoch + batch_in_epoch / train_data.batches_per_epoch(epoch)})
                bar.set_postfix(loss=f"{train_metrics['loss']:.3f}", lr=f"{lr:.2e}",
                                tok_s=f"{train_metrics['tokens_per_s']:.0f}", refresh=False)
                win.zero_()
                win_tokens, win_steps, win_t0 = 0, 0, time.perf_counter()
            bar.update(1 if total_steps is not None else min(int(elapsed), bar_total) - bar.n)
            if eval_due:
                run_eval()
                last_eval_step = step
            if ckpt_due:
                save_last()
                last_ckpt_step, last_ckpt_time = step, elapsed
            while snapshots and elapsed >= snapshots[0] * 60:
                if main:  # weights as at that minute, in best.pt's format (fine-tune them directly)
                    ckpt_lib.save_checkpoint(snapshot_path(out_dir, snapshots[0]), checkpoint_state(False))
                snapshots.pop(0)
    finally:
        bar.close()
        if hasattr(stream, "close"):
            stream.close()

    completed = finished(elapsed)
    final_eval = completed and valid_data is not None and last_eval_step != step
    if final_eval:
        run_eval()
    if step != last_ckpt_step or final_eval or state is None:
        save_last()
    if main:
        write_curves(history, curves_dir)

    weights_sha = model_sha256(raw_model)
    if world > 1:  # DDP keeps replicas identical; prove it rather than assume it
        shas = [None] * world
        dist.all_gather_object(shas, weights_sha)
        if len(set(shas)) != 1:
            raise BertraceError(f"DDP ranks ended with different weights ({shas}); a bug: please report it")

    session_s = max(time.perf_counter() - t0, 1e-9)
    n_batches = train_data.batches_per_epoch(epoch)
    return {
        "step": step,
        "completed": completed,
        "tokens_seen": tokens_seen,
        "train_seconds": round(elapsed, 3),
        "epochs": round(epoch + batch_in_epoch / n_batches, 4),
        "tokens_per_s": round((tokens_seen - start_tokens) / session_s, 1) if step > start_step else None,
        "steps_per_s": round((step - start_step) / session_s, 3) if step > start_step else None,
        **{k: v for k, v in train_metrics.items() if k != "tokens_per_s"},
        **last_val,
        "best_val_mlm_loss": None if best == math.inf else best,
        "num_parameters": n_params,
        "model_sha256": weights_sha,
        "train_flops": float(flops_tok) * tokens_seen,
        "mfu": _mfu(float(flops_tok) * (tokens_seen - start_tokens) / session_s, device, precision, world),
        "batch_size": cfg.batch_size,
        "world_size": world,
        "device": str(device),
        "precision": precision,
    }
