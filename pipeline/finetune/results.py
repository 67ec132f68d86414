"""One fine-tuning seed's result and the numbers over seeds (per task type:
:meth:`pipeline.finetune.tasks.base.TaskType.summarize`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.finetune.tasks.registry import get


@dataclass
class SeedResult:
    seed: int
    validation_accuracy: float  # at the best check (the weights kept)
    validation_loss: float
    best_step: int
    best_epoch: float
    steps: int  # optimizer steps run
    planned_steps: int
    epochs_run: float
    stopped_early: bool
    train_loss: float  # mean over the last epoch's steps
    history: list[dict[str, float]]  # one entry per validation check
    cpu_seconds: float  # timings: the run log's (:func:`seed_timings`), never in :meth:`metrics`
    wall_seconds: float
    state_dict: dict[str, torch.Tensor] | None = field(default=None, repr=False)  # best weights (CPU)
    task_type: str = "classification"
    validation: dict[str, float] = field(default_factory=dict)  # every metric at the best check

    @property
    def score(self) -> float:
        """The selection metric at the best check (classification: accuracy; token
        classification: entity F1; regression: Pearson r), NaN as -inf."""
        return get(self.task_type).seed_score(self)

    def metrics(self) -> dict[str, Any]:
        """The numbers (no weights, no history, no timings) as a JSON-able dict: a function of the
        data, params and seed alone."""
        out = {
            k: getattr(self, k)
            for k in (
                "seed",
                "validation_accuracy",
                "validation_loss",
                "best_step",
                "best_epoch",
                "steps",
                "planned_steps",
                "epochs_run",
                "stopped_early",
                "train_loss",
            )
        }
        return get(self.task_type).seed_metrics(self, out)  # e.g. validation_f1 / _pearson for _accuracy


def summarize(results: list[SeedResult]) -> dict[str, Any]:
    """Per-seed metrics and mean ± std over seeds of the task type's validation metrics
    (classification: accuracy and loss); ``timings``: :func:`~pipeline.finetune.stats.seed_timings`,
    kept apart from the numbers (:func:`headline_metrics` and ``per_seed`` leave them out)."""
    return get(results[0].task_type if results else "classification").summarize(results)


def headline_metrics(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's numbers for ``metrics/finetune.json`` (before per_seed), per task type:
    classification ``validation_accuracy``, ``validation_loss``, ``best_seed``,
    ``best_validation_accuracy`` (unchanged); token classification ``validation_f1`` /
    ``_precision`` / ``_recall`` / ``_accuracy`` (words); regression ``validation_pearson`` /
    ``_spearman`` / ``_mse``; each with ``best_validation_<selection metric>``. No timings."""
    skip = ("seeds", "per_seed", "timings")
    return {k: v for k, v in summary.items() if k not in skip}


def checkpoint_metrics(summary: dict[str, Any], best: SeedResult, seeds: list[int]) -> dict[str, Any]:
    """The ``metrics`` entry of the fine-tuned checkpoint: the best seed's validation numbers and
    the mean ± std of the selection metric over seeds."""
    return get(best.task_type).checkpoint_metrics(summary, best, seeds)


__all__ = ["SeedResult", "checkpoint_metrics", "headline_metrics", "summarize"]
