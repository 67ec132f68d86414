"""``regression``: one float per example (STS-B's 0..5 similarity, ``label_names: []``): the sequence
head with one output, mean squared error (transformers' ``problem_type="regression"``), Pearson r
to pick the best check and seed (STS-B's official metric; Spearman and MSE are reported too)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.core.errors import BertraceError
from pipeline.finetune.task_files import Rows, missing_error
from pipeline.finetune.task_metrics import regression_metrics
from pipeline.finetune.tasks.base import TaskType


def score_labels(values: list, rows: Rows, label_column: str, role: str, skip: np.ndarray) -> torch.Tensor | None:
    """Regression targets as float32; rows in ``skip`` (empty text) are not checked. Every kept
    row empty / NaN = an unlabelled (test) split; some = an error."""
    out = np.full(len(values), np.nan, dtype=np.float64)
    bad: list[Any] = []
    for i, v in enumerate(values):
        if skip[i]:
            continue
        if isinstance(v, str):
            v = v.strip()
            if not v:
                continue
        try:
            out[i] = np.nan if v is None else float(v)
        except (TypeError, ValueError):
            bad.append(v)
    if bad:
        shown = sorted({repr(b) for b in bad})[:8]
        raise BertraceError(
            f"{rows.where}: column {label_column!r} must hold numbers for a regression task: "
            f"{', '.join(shown)} ({len(bad)} rows); fix the file or finetune.task.label_column"
        )
    missing = np.flatnonzero(np.isnan(out) & ~skip)
    kept = int((~skip).sum())
    if len(missing) == kept:
        if role != "test":
            raise BertraceError(
                f"{rows.where}: the {role} split has no scores; pick a labelled split in finetune.task.splits.{role}"
            )
        return None
    if len(missing):
        raise missing_error(rows, label_column, "score", missing, kept)
    return torch.from_numpy(out.astype(np.float32))


class Regression(TaskType):
    """One number per example: see the module docstring."""

    name: ClassVar[str] = "regression"
    selection: ClassVar[str] = "pearson"
    short: ClassVar[str] = "pearson"
    metric_title: ClassVar[str] = "Pearson r"
    title: ClassVar[str] = "regression"
    evaluation: ClassVar[str] = "scores"
    dvc_keys: ClassVar[tuple[str, ...]] = ("pearson", "spearman")
    has_label_names: ClassVar[bool] = False
    hf_problem_type: ClassVar[str | None] = "regression"

    def check_params(self, params) -> None:
        if params.label_names:
            raise BertraceError(
                f"params.yaml: finetune.task.label_names is {params.label_names!r}; a regression task "
                "predicts one number and has no label names: set finetune.task.label_names: []"
            )

    def read_labels(self, rows, text_columns, label_column, label_names, role, skip):
        return score_labels(rows.columns[label_column], rows, label_column, role, skip)

    def item_label(self, split, i: int) -> Any:
        return math.nan if split.labels is None else float(split.labels[i])

    def num_outputs(self, label_names) -> int:
        return 1

    def outputs_match(self, n_names: int, num_labels: int) -> bool:
        return n_names == num_labels or num_labels == 1

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Mean squared error of the single output, in float32."""
        return F.mse_loss(logits.float().squeeze(-1), labels.float(), reduction=reduction)

    def outputs(self, logits: torch.Tensor) -> list[Any]:
        return logits.squeeze(-1).cpu().tolist()

    def metrics(self, outputs, split, label_names, loss: float, n: int) -> dict:
        """``pearson`` / ``spearman`` / ``mse`` (:func:`~pipeline.finetune.task_metrics.regression_metrics`)."""
        return {**regression_metrics(outputs, split.labels.tolist()), "loss": loss, "n": n}

    def format_predictions(self, logits: np.ndarray, label_names: list[str]) -> list[dict[str, Any]]:
        """``[{"score": float}]``."""
        return [{"score": float(row[0])} for row in np.asarray(logits)]

    def pyfunc_columns(self, clf, inputs, batch_size: int) -> dict[str, Any]:
        """One column: the predicted score."""
        return {"score": clf.logits(inputs, batch_size=batch_size)[:, 0].astype(np.float64)}

    def result_line(self, role: str, r: dict[str, Any]) -> str:
        return f"{role} Pearson {r['pearson']:.4f} (Spearman {r['spearman']:.4f}, MSE {r['mse']:.4f}, n={r['n']})"

    def hf_fields(self, label_names: list[str], family: str) -> tuple[dict[str, Any], str]:
        """One output, MSE: transformers' problem_type regression."""
        return (
            {"num_labels": 1, "problem_type": "regression", "architectures": [f"{family}ForSequenceClassification"]},
            f"{family}ForSequenceClassification",
        )


__all__ = ["Regression", "score_labels"]
