"""Scoring a fine-tuned checkpoint on the task's held-out splits: per split the metrics, the gold and
predicted values the figures draw, and the notes the evaluation report lists (unlabelled splits,
truncation, the re-evaluated validation metric against the one fine-tuning recorded).

Classification: :func:`pipeline.evaluate.report.evaluate_logits`; token classification and
regression: :mod:`pipeline.evaluate.tasks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import BertraceError
from pipeline.evaluate.report import evaluate_logits


@dataclass
class Scores:
    """What scoring the splits gave: ``results`` per split (the first is the primary one),
    ``outputs`` per split ``(gold, predicted)``, report ``notes`` and console ``warnings``."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def primary(self) -> str:
        return next(iter(self.results))


def _require_labels(scores: Scores, roles: list[str]) -> Scores:
    if not scores.results:
        raise BertraceError(f"params.yaml: none of evaluate.splits {roles} has labels; add a labelled split")
    return scores


def _labelled(data, roles: list[str], scores: Scores):
    """``(role, split)`` of the roles whose split has labels; a note for each that has none."""
    for role in roles:
        split = data.splits[role]
        if split.labels is None:
            scores.notes.append(f"{role} ({split.source}) has no labels: not scored")
            continue
        yield role, split


def _compare_recorded(scores: Scores, clf, metric: str, tolerance: float, suspect: str = "") -> None:
    """A note comparing the re-evaluated validation ``metric`` with the one fine-tuning recorded."""
    recorded = (clf.checkpoint.get("metrics") or {}).get(f"validation_{metric}")
    if recorded is None or "validation" not in scores.results:
        return
    now = scores.results["validation"][metric]
    diff = abs(now - float(recorded))
    scores.notes.append(
        f"re-evaluated validation {metric} {now:.4f} vs {float(recorded):.4f} recorded by fine-tuning"
        + (" (equal)" if diff < tolerance else f" (differs by {diff:.4f}{suspect})")
    )


def score_classification(clf, data, roles: list[str], batch_size: int, progress: bool) -> Scores:
    """Accuracy, F1 and the rest per labelled split (``outputs``: labels, argmax predictions)."""
    scores = Scores()
    for role, split in _labelled(data, roles, scores):
        logits = clf.logits_from_ids(split.input_ids, split.token_type_ids, batch_size=batch_size, progress=progress)
        labels = split.labels.numpy()
        scores.results[role] = evaluate_logits(logits, labels, clf.label_names)
        scores.outputs[role] = (labels, logits.argmax(axis=1))
        if split.truncated:
            scores.notes.append(
                f"{role}: {split.truncated} of {len(split)} examples cut to {clf.max_len} tokens ({clf.truncation})"
            )
    _require_labels(scores, roles)
    _compare_recorded(scores, clf, "accuracy", 1e-9, ": a different split or data?")
    return scores


def _token_notes(role: str, split, result: dict[str, Any], scores: Scores) -> None:
    if result["predicted_entities"] == 0:
        warning = (
            f"{role}: the model tags every word O (no entity predicted; entity F1 0): too few "
            "updates or too low finetune.lr for this model"
        )
        scores.warnings.append(warning)
        scores.notes.append(f"**Warning** — {warning}")
    if split.bio_violations:
        scores.notes.append(
            f"{role}: {split.bio_violations} gold I- tags do not follow a B-/I- tag of their type "
            "(IOB2 violations; seqeval reads them as entity starts)"
        )
    if split.multi_tags:
        scores.notes.append(
            f"{role}: {split.multi_tags} words of {split.source} list several comma-separated "
            "tags; the first was used as gold"
        )


def score_task(clf, data, roles: list[str], batch_size: int, progress: bool) -> Scores:
    """Entity F1 (token classification) or Pearson / Spearman (regression) per labelled split."""
    from pipeline.evaluate.tasks import regression_results, token_results

    tokens = clf.task.token_level
    scores = Scores()
    for role, split in _labelled(data, roles, scores):
        if tokens:
            scores.results[role], gold, pred = token_results(clf, split, batch_size, progress)
            _token_notes(role, split, scores.results[role], scores)
        else:
            scores.results[role], pred, gold = regression_results(clf, split, batch_size, progress)
        scores.outputs[role] = (gold, pred)
        if split.truncated:
            scores.notes.append(
                f"{role}: {split.truncated} of {len(split)} examples cut to {clf.max_len} tokens"
                + (" (words past the cut are predicted O)" if tokens else "")
            )
    _require_labels(scores, roles)
    _compare_recorded(scores, clf, clf.task.selection, 1e-6)
    return scores


def checkpoint_facts(clf, model_path: Path, ckpt_sha: str, tok_sha: str) -> dict[str, Any]:
    """The evaluation report's "Checkpoint" rows common to every task type."""
    arch = clf.model.config
    return {
        "path": model_path.as_posix(),
        "sha256": ckpt_sha,
        "tokenizer_sha256": tok_sha,
        "mode": clf.checkpoint.get("mode"),
        "seed": clf.checkpoint.get("seed"),
        "num_parameters": f"{sum(p.numel() for p in clf.model.parameters()):,}",
        "model": f"{arch.num_layers} layers, hidden {arch.hidden_size}, {arch.num_heads} heads, vocab {arch.vocab_size}",
    }
