"""The learning-rate schedule of every optimiser in the project: linear warmup, then linear decay to 0.

:func:`linear_warmup_decay` is the one formula: the multiplier of the peak rate at ``t``, where ``t``
counts updates (``total``: the planned number) or is the fraction of a wall-clock budget spent
(``total``: 1.0). The decay starts at the end of the warmup. Google's ``optimization.py`` decays
from step 0 under the ramp, so its peak is ``lr * (1 - warmup / total)``; here the peak is ``lr``.

The consumers differ in one convention, the explicit ``ramp_offset``: whether update ``t`` ramps
by ``t / warmup`` (0) or ``(t + 1) / warmup`` (1). Each keeps its own, because the convention is
part of the weights it has produced and recorded (the golden hashes of tests/e2e/test_golden.py):

* pre-training by updates (:func:`lr_at_step`, ``ramp_offset=1``): the first update already moves
  and the peak is reached at update ``warmup - 1``, as in Karpathy's build-nanogpt ``get_lr``
  (``max_lr * (it + 1) / warmup_steps``, "so that at it=0 we don't have lr=0");
* pre-training by wall clock (:func:`lr_at_progress`, ``ramp_offset=0``): cramming's time-based
  schedule (Geiping & Goldstein 2022, section 3), ``t`` the fraction of the budget spent;
* fine-tuning (``pipeline/finetune/loop.py``, through torch's ``LambdaLR``, ``ramp_offset=0``):
  Google's ``optimization.py`` (``global_step / num_warmup_steps``) and Hugging Face's
  ``get_linear_schedule_with_warmup``: the first update runs at rate 0;
* the skip-gram embedding init (``pipeline/pretrain/wordvec.py``): :func:`lr_at_progress` with no
  warmup, word2vec.c's linear decay ``lr * (1 - step / total)``.

The rate is a pure function of ``(step, budget)``, evaluated at every update: resuming pre-training
with a larger budget stretches the schedule instead of pinning the rate at 0. :class:`Budget` says
when pre-training ends and what the rate is on the way.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

from pipeline.core.errors import BertraceError


def linear_warmup_decay(t: float, *, warmup: float, total: float, ramp_offset: Literal[0, 1]) -> float:
    """Multiplier (0..1) of the peak rate at ``t``: a linear ramp by ``(t + ramp_offset) / warmup``
    to 1, then linear decay reaching 0 at ``total``. ``warmup`` 0: no ramp. A warmup as long as the
    budget leaves no decay (the ``1e-9`` floor): the rate falls to 0 at ``total``."""
    ramp = (t + ramp_offset) / warmup if warmup > 0 else 1.0
    decay = (total - t) / max(total - warmup, 1e-9)
    return max(0.0, min(1.0, ramp, decay))


def lr_at_step(step: int, *, peak: float, warmup_steps: int, total_steps: int) -> float:
    """Rate for update ``step`` (0-based): linear ramp to ``peak`` at update ``warmup_steps - 1``,
    then linear decay reaching 0 at ``total_steps`` (the end of the budget)."""
    return peak * linear_warmup_decay(step, warmup=warmup_steps, total=total_steps, ramp_offset=1)


def lr_at_progress(progress: float, *, peak: float, warmup_fraction: float) -> float:
    """Rate at ``progress`` (0..1) through a budget (cramming's time-based schedule)."""
    return peak * linear_warmup_decay(progress, warmup=warmup_fraction, total=1.0, ramp_offset=0)


def warmup_steps_for(warmup: float, total_steps: int) -> int:
    """``warmup`` < 1 is a fraction of ``total_steps``; otherwise a step count."""
    return int(round(warmup * total_steps)) if warmup < 1 else int(warmup)


def budget_steps(
    *, max_steps: int | None, epochs: float | None, grad_accum: int, batches_per_epoch: Callable[[int], int]
) -> int | None:
    """Updates in a ``max_steps`` or ``epochs`` budget (``batches_per_epoch(e)``: the micro-batches
    of epoch ``e``); None for a time budget."""
    if max_steps:
        return int(max_steps)
    if epochs:
        full = int(epochs)
        micro = sum(batches_per_epoch(e) for e in range(full))
        micro += int(round((epochs - full) * batches_per_epoch(full)))
        steps = micro // grad_accum
        if steps < 1:
            raise BertraceError(f"params.yaml: pretrain.epochs = {epochs} is less than one update; raise it")
        return steps
    return None


class Budget:
    """When training ends and the learning rate on the way: a number of updates (``max_steps``,
    or ``epochs`` converted to updates by :func:`budget_steps`) or wall-clock minutes (``time_minutes``)."""

    def __init__(
        self,
        kind: str,
        value: float,
        *,
        peak: float,
        warmup: float,
        total_steps: int | None,
        extends: list[dict] | None = None,
    ):
        self.extends = list(extends or [])  # earlier budgets this run's weights were trained under (resume: true)
        self.kind, self.value = kind, value
        self.peak, self.warmup = peak, warmup
        self.total_steps = total_steps  # None for a time budget
        self.seconds = value * 60.0 if kind == "time_minutes" else None
        self.warmup_steps = warmup_steps_for(warmup, total_steps) if total_steps else 0

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
