"""Metrics of the token-classification and regression task types (classification's live in
:mod:`pipeline.evaluate.report`).

* NER: entity-level precision / recall / F1 by ``seqeval`` (Ramshaw & Marcus chunks read as
  conlleval does: the CoNLL-2003 shared task's official scorer; an entity counts only when type
  and both boundaries match), micro-averaged over entities, per entity type, plus word-level
  accuracy. Words are scored once each (the first sub-token's prediction, see
  :mod:`pipeline.finetune.token_data`).
* Regression: Pearson r (STS-B's official metric), Spearman ρ (``scipy.stats``) and mean
  squared error of the raw prediction.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from pipeline.core.errors import BertraceError


def entity_metrics(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, Any]:
    """``{"n", "words", "entities", "predicted_entities", "precision", "recall", "f1", "accuracy",
    "per_type": {type: {precision, recall, f1, support}}}`` for word tag sequences (IOB2 strings)."""
    from seqeval.metrics import accuracy_score, classification_report, f1_score, precision_score, recall_score

    from pipeline.finetune.token_data import entities

    gold, pred = [list(s) for s in gold], [list(s) for s in pred]
    if len(gold) != len(pred) or any(len(g) != len(p) for g, p in zip(gold, pred)):
        raise BertraceError("evaluation: gold and predicted tag sequences differ in shape")
    if not gold or not any(gold):
        raise BertraceError("evaluation: no sentences to evaluate (the split is empty)")
    report = classification_report(gold, pred, output_dict=True, zero_division=0)
    per_type = {
        k: {
            "precision": float(v["precision"]),
            "recall": float(v["recall"]),
            "f1": float(v["f1-score"]),
            "support": int(v["support"]),
        }
        for k, v in sorted(report.items())
        if not k.endswith(" avg")
    }
    return {
        "n": len(gold),
        "words": sum(map(len, gold)),
        "entities": sum(v["support"] for v in per_type.values()),
        "predicted_entities": sum(len(entities(s)) for s in pred),
        "precision": float(precision_score(gold, pred, zero_division=0)),
        "recall": float(recall_score(gold, pred, zero_division=0)),
        "f1": float(f1_score(gold, pred, zero_division=0)),
        "accuracy": float(accuracy_score(gold, pred)),
        "per_type": per_type,
    }


def regression_metrics(pred: Sequence[float], gold: Sequence[float]) -> dict[str, Any]:
    """``{"n", "pearson", "spearman", "mse"}``; a correlation is NaN when either side is constant
    (e.g. a model that learned to predict the mean), as scipy defines it, without its warning."""
    from scipy import stats

    p = np.asarray(pred, dtype=np.float64).reshape(-1)
    g = np.asarray(gold, dtype=np.float64).reshape(-1)
    if p.shape != g.shape:
        raise BertraceError(f"evaluation: {g.size} scores but {p.size} predictions")
    if g.size < 2:
        raise BertraceError("evaluation: need at least 2 examples for a correlation")
    constant = np.ptp(p) == 0 or np.ptp(g) == 0
    pearson = math.nan if constant else float(stats.pearsonr(p, g).statistic)
    spearman = math.nan if constant else float(stats.spearmanr(p, g).statistic)
    return {"n": int(g.size), "pearson": pearson, "spearman": spearman, "mse": float(np.mean((p - g) ** 2))}


def score_buckets(values: Sequence[float], low: float = 0.0, high: float = 5.0) -> list[int]:
    """Scores rounded to the nearest integer and clipped to ``[low, high]`` (STS-B's 0..5 grades):
    the classes of the regression task's confusion matrix."""
    v = np.clip(np.rint(np.asarray(values, dtype=np.float64)), low, high)
    return [int(x) for x in v]


__all__ = ["entity_metrics", "regression_metrics", "score_buckets"]
