"""``classification``: one label per example (SST-2's sentiment, a sentence pair's entailment), a
Linear on the pooled vector, cross-entropy, validation accuracy (run_classifier.py, Devlin et al.
2018 section 4.1). ``label_column`` holds ints (indices into ``label_names``) or strings (mapped
through ``label_names``, compared in Unicode NFC)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.core.device import amp_dtype
from pipeline.core.errors import BertraceError
from pipeline.finetune.stats import best_seed, mean_std, seed_timings
from pipeline.finetune.task_files import Rows, missing_error, nfc
from pipeline.finetune.tasks.base import TaskType


def class_labels(
    values: list, label_names: list[str], rows: Rows, label_column: str, role: str, skip: np.ndarray
) -> torch.Tensor | None:
    """Label ids: ints index ``label_names``; strings are looked up in it (in NFC; digit strings
    may also be indices). Rows in ``skip`` (empty text) are not checked. Every kept row without a
    label (empty, null or -1) = an unlabelled split (GLUE's test): None; some = an error."""
    index = {name: i for i, name in enumerate(label_names)}
    out = np.full(len(values), -1, dtype=np.int64)
    bad: list[Any] = []
    for i, v in enumerate(values):
        if skip[i]:
            continue
        if isinstance(v, str):
            v = nfc(v.strip())
            if not v:
                continue
            if v in index:
                out[i] = index[v]
                continue
            try:
                v = int(v)
            except ValueError:
                out[i] = -2
                bad.append(v)
                continue
        if v is None or (isinstance(v, float) and np.isnan(v)):
            continue
        if isinstance(v, (bool, np.bool_)) or not float(v).is_integer():
            out[i] = -2
            bad.append(v)
            continue
        v = int(v)
        out[i] = v if 0 <= v < len(label_names) or v == -1 else -2
        if out[i] == -2:
            bad.append(v)
    if bad:
        shown = sorted({repr(b) for b in bad})[:8]
        raise BertraceError(
            f"{rows.where}: column {label_column!r} has labels outside finetune.task.label_names "
            f"{label_names}: {', '.join(shown)} ({len(bad)} rows); list every label "
            f"in finetune.task.label_names (string labels by name, integer labels 0..{len(label_names) - 1})"
        )
    missing = np.flatnonzero((out == -1) & ~skip)
    kept = int((~skip).sum())
    if len(missing) == kept:
        if role != "test":
            raise BertraceError(
                f"{rows.where}: the {role} split has no labels (all -1 / empty); pick a labelled "
                f"split in finetune.task.splits.{role}"
            )
        return None
    if len(missing):
        raise missing_error(rows, label_column, "label", missing, kept)
    return torch.from_numpy(out)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (stable: the row max is subtracted)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class Classification(TaskType):
    """One class per example: see the module docstring."""

    name: ClassVar[str] = "classification"
    selection: ClassVar[str] = "accuracy"
    short: ClassVar[str] = "acc"
    metric_title: ClassVar[str] = "accuracy"
    title: ClassVar[str] = "classification"
    evaluation: ClassVar[str] = "accuracy"
    hf_problem_type: ClassVar[str | None] = "single_label_classification"
    electra_export: ClassVar[bool] = True

    def read_labels(self, rows, text_columns, label_column, label_names, role, skip):
        return class_labels(rows.columns[label_column], label_names, rows, label_column, role, skip)

    def item_label(self, split, i: int) -> Any:
        return -100 if split.labels is None else int(split.labels[i])

    def label_counts(self, split, num_labels: int) -> list[int]:
        if split.labels is None:
            return []
        return torch.bincount(split.labels, minlength=num_labels).tolist()

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy in float32."""
        return F.cross_entropy(logits.float(), labels, reduction=reduction)

    @torch.no_grad()
    def evaluate(self, model, split, batch_size, device, label_names=None) -> dict[str, float]:
        """``{"accuracy", "loss", "n"}``; sums stay on the device until the end (one sync per
        evaluation, not two per batch)."""
        was_training = model.training
        model.eval()
        amp = amp_dtype(device)
        order = sorted(range(len(split)), key=lambda i: len(split.input_ids[i]))
        correct = torch.zeros((), dtype=torch.long, device=device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        for s in range(0, len(order), batch_size):
            batch = {
                k: v.to(device, non_blocking=True)
                for k, v in self.collate([split[i] for i in order[s : s + batch_size]]).items()
            }
            with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).float()
            loss_sum += F.cross_entropy(logits, batch["labels"], reduction="sum").double()
            correct += (logits.argmax(-1) == batch["labels"]).sum()
        model.train(was_training)
        n = len(order)
        return {"accuracy": correct.item() / n, "loss": loss_sum.item() / n, "n": n}

    def selection_value(self, metrics: dict[str, Any]) -> float:
        return metrics["accuracy"]

    def history_point(self, step: int, epoch: float, ev: dict[str, Any], train_loss: float) -> dict[str, Any]:
        return {
            "step": step,
            "epoch": epoch,
            "validation_accuracy": ev["accuracy"],
            "validation_loss": ev["loss"],
            "train_loss": train_loss,
        }

    def seed_score(self, result) -> float:
        return result.validation_accuracy

    def seed_metrics(self, result, out: dict[str, Any]) -> dict[str, Any]:
        return out

    def summarize(self, results: list) -> dict[str, Any]:
        """Validation accuracy (mean, std, min, max) and loss over the seeds."""
        acc_mean, acc_std = mean_std([r.validation_accuracy for r in results])
        loss_mean, loss_std = mean_std([r.validation_loss for r in results])
        best = best_seed(results)
        return {
            "seeds": [r.seed for r in results],
            "per_seed": {str(r.seed): r.metrics() for r in results},
            "validation_accuracy": {
                "mean": acc_mean,
                "std": acc_std,
                "min": min(r.validation_accuracy for r in results),
                "max": max(r.validation_accuracy for r in results),
            },
            "validation_loss": {"mean": loss_mean, "std": loss_std},
            "best_seed": best.seed,
            "best_validation_accuracy": best.validation_accuracy,
            "timings": seed_timings(results),
        }

    def checkpoint_metrics(self, summary: dict[str, Any], best, seeds: list[int]) -> dict[str, Any]:
        return {
            "validation_accuracy": best.validation_accuracy,
            "validation_loss": best.validation_loss,
            "validation_accuracy_mean": summary["validation_accuracy"]["mean"],
            "validation_accuracy_std": summary["validation_accuracy"]["std"],
            "seeds": list(seeds),
        }

    def format_predictions(self, logits: np.ndarray, label_names: list[str]) -> list[dict[str, Any]]:
        """``[{"label": name, "label_id": int, "probabilities": {name: p}}]``."""
        out = []
        for row in softmax(logits):
            k = int(row.argmax())
            out.append(
                {
                    "label": label_names[k],
                    "label_id": k,
                    "probabilities": {name: float(p) for name, p in zip(label_names, row)},
                }
            )
        return out

    def pyfunc_columns(self, clf, inputs, batch_size: int) -> dict[str, Any]:
        """``label``, ``label_id`` and ``prob_<name>`` per label."""
        probs = softmax(clf.logits(inputs, batch_size=batch_size))
        ids = probs.argmax(axis=1) if len(probs) else np.zeros(0, dtype=np.int64)
        out = {"label": [clf.label_names[int(i)] for i in ids], "label_id": ids.astype(np.int64)}
        for k, name in enumerate(clf.label_names):
            out[f"prob_{name}"] = probs[:, k] if len(probs) else np.zeros(0)
        return out


__all__ = ["Classification", "class_labels", "softmax"]
