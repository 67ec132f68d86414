"""The pre-training trainer: how a run learns, whatever the objective.

:class:`Trainer` runs updates (``train_step``: AdamW, gradient clipping, AMP, gradient accumulation),
logging windows, validation (``evaluate``), checkpoints (``save_last``, snapshots) and the loop that
calls them as the budget and cadence say (``fit``). The recipe is Google's ``run_pretraining.py`` /
``optimization.py`` (Devlin et al. 2019, appendix A.2): AdamW with decoupled weight decay (none on
biases and LayerNorm), gradient clipping at global norm 1.0, the rate of
:mod:`pipeline.pretrain.schedule` set on every update.

``batch_size`` is the *global* batch: examples per optimizer update over all ranks and accumulation
steps; each rank reads ``batch_size / (grad_accum * world_size)`` examples per micro-batch.
``snapshot_minutes`` and ``checkpoint_minutes`` are wall clock: they never change the weights, but
which weights a minute-snapshot holds, and which rows the loss curves log (a checkpoint closes a
logging window), depend on speed; ``snapshot_steps`` and ``checkpoint_every`` are the reproducible
equivalents. ``compile: true``: the first update of a session compiles the model and the clock
starts after it."""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from tqdm import tqdm

from pipeline.core.device import build_adamw, mfu
from pipeline.core.errors import BertraceError
from pipeline.models import checkpoint as ckpt_lib
from pipeline.models.bert import num_parameters, param_groups
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.data import PretrainingData, prefetch
from pipeline.pretrain.distributed import all_reduce, autocast, broadcast_float, cpu_group, gather_rng
from pipeline.pretrain.metrics import model_sha256, validation_metrics, write_curves
from pipeline.pretrain.objectives.base import Objective
from pipeline.pretrain.schedule import Budget


def snapshot_path(out_dir: str | Path, minute: float) -> Path:
    """Where ``pretrain.snapshot_minutes`` keeps the weights at ``minute``: snapshots/minute-015.pt."""
    label = f"{int(minute):03d}" if minute == int(minute) else f"{minute:07.3f}".rstrip("0")
    return Path(out_dir) / "snapshots" / f"minute-{label}.pt"


def step_snapshot_path(out_dir: str | Path, step: int) -> Path:
    """Where ``pretrain.snapshot_steps`` keeps the weights after update ``step``: snapshots/step-002000.pt."""
    return Path(out_dir) / "snapshots" / f"step-{int(step):06d}.pt"


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
        rngs = gather_rng(self.world, self.rank)  # a collective: every rank takes part
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
                with autocast(self.device, self.autocast_dtype):
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
        all_reduce(stats, self.world)
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
        clock_group = cpu_group(world) if clock else None
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
                self.elapsed = broadcast_float(now, self.device, world, clock_group) if clock else now

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
        """This session's :data:`~pipeline.pretrain.metrics.TIMINGS` (the run log's, never a DVC output): ``train_seconds`` (the
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
