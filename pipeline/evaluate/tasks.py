"""Evaluation of the token-classification (NER) and regression task types: numbers, plots and the
markdown report. Classification keeps :mod:`pipeline.evaluate.report`; the evaluate stage writes the same
files for every task type (DVC declares them), so:

* ``plots/confusion.csv`` / ``reports/confusion.png``: NER — the word-level tag confusion (gold
  tag vs the tag predicted at the word's first sub-token); regression — gold and predicted scores
  rounded to the nearest integer grade 0..5 (STS-B's scale), a coarse view of the same errors.
* ``plots/scatter.csv`` / ``reports/scatter.png``: regression — predicted vs gold per pair (DVC
  ``scatter`` template); for the other task types a header-only CSV and a PNG saying there is no
  scatter plot for that task type.

Metrics: :mod:`pipeline.finetune.task_metrics` (seqeval entity-level P/R/F1 per type; Pearson, Spearman,
MSE).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipeline.core.io import atomic_open
from pipeline.evaluate.report import checkpoint_section, confusion_matrix, provenance_lines, save_figure
from pipeline.finetune.task_metrics import entity_metrics, regression_metrics, score_buckets
from pipeline.finetune.tasks.registry import get as get_task

GRADES = [str(g) for g in range(6)]  # STS-B's 0..5 similarity grades: the regression confusion's classes


# --------------------------------------------------------------------------------------------
# Metrics per split


def token_results(
    clf, split, batch_size: int = 128, progress: bool = False
) -> tuple[dict[str, Any], list[int], list[int]]:
    """``(metrics, gold tag ids, predicted tag ids)`` of a labelled token-classification split;
    ids are per word (all sentences concatenated), metrics as :func:`entity_metrics` plus the
    word-level ``confusion_matrix`` and ``labels``."""
    from pipeline.finetune.token_data import word_predictions

    names = clf.label_names
    logits = clf.token_logits_from_ids(split.input_ids, split.token_type_ids, batch_size=batch_size, progress=progress)
    pred = [word_predictions(lg, first, names) for lg, first in zip(logits, split.first)]
    gold = [[names[t] for t in tags] for tags in split.word_labels]
    m = entity_metrics(gold, pred)
    index = {n: i for i, n in enumerate(names)}
    gold_ids = [t for tags in split.word_labels for t in tags]
    pred_ids = [index[t] for tags in pred for t in tags]
    m["confusion_matrix"] = confusion_matrix(gold_ids, pred_ids, len(names)).tolist()
    m["labels"] = list(names)
    return m, gold_ids, pred_ids


def regression_results(
    clf, split, batch_size: int = 128, progress: bool = False
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """``(metrics, predicted, gold)`` of a labelled regression split; metrics as
    :func:`regression_metrics` plus the rounded-grade ``confusion_matrix`` and ``labels``."""
    pred = clf.logits_from_ids(split.input_ids, split.token_type_ids, batch_size=batch_size, progress=progress)[
        :, 0
    ].astype(np.float64)
    gold = split.labels.numpy().astype(np.float64)
    m = regression_metrics(pred, gold)
    m["gold_mean"], m["predicted_mean"] = float(gold.mean()), float(pred.mean())
    m["confusion_matrix"] = confusion_matrix(score_buckets(gold), score_buckets(pred), len(GRADES)).tolist()
    m["labels"] = list(GRADES)
    return m, pred, gold


def details_for_dvc(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per split, the numbers (no matrices): ``reports/evaluate.json``."""
    return {
        split: {k: v for k, v in m.items() if k not in ("confusion_matrix", "labels")} for split, m in results.items()
    }


SHORT = {"validation": "dev", "test": "test"}


def summary_for_dvc(task_type: str, results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The few numbers of ``metrics/eval.json`` per split: NER ``dev_f1`` (entity level),
    regression ``dev_pearson`` and ``dev_spearman`` (``test_*`` likewise)."""
    keys = get_task(task_type).dvc_keys
    return {f"{SHORT.get(split, split)}_{k}": m[k] for split, m in results.items() for k in keys}


# --------------------------------------------------------------------------------------------
# Scatter data (DVC plot) and picture


def write_scatter_csv(path: str | Path, predicted: Sequence[float] | None, gold: Sequence[float] | None) -> Path:
    """``predicted,gold`` per example (header only when there is nothing to plot)."""
    path = Path(path)
    with atomic_open(path) as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["predicted", "gold"])
        for p, g in zip(predicted if predicted is not None else [], gold if gold is not None else []):
            w.writerow([f"{float(p):.6g}", f"{float(g):.6g}"])
    return path


def plot_scatter(
    path: str | Path,
    predicted: Sequence[float] | None,
    gold: Sequence[float] | None,
    title: str = "",
    message: str | None = None,
) -> Path:
    """PNG of predicted vs gold with the diagonal; or, with ``message``, a figure stating it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.0, 5.0), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if message is not None:
        ax.axis("off")
        ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, fontsize=11)
    else:
        p, g = np.asarray(predicted, dtype=np.float64), np.asarray(gold, dtype=np.float64)
        ax.scatter(g, p, s=6, alpha=0.4, color="tab:blue", edgecolors="none")
        lo, hi = float(min(g.min(), p.min())), float(max(g.max(), p.max()))
        ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1, linestyle="--", label="predicted = gold")
        ax.set_xlabel("gold score")
        ax.set_ylabel("predicted score")
        ax.legend(loc="upper left", fontsize=8)
        ax.set_title(title, fontsize=10)
    return save_figure(fig, path)


# --------------------------------------------------------------------------------------------
# Markdown report


def _pct(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.2f}"


def _num(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def render_task_report(
    task_type: str,
    results: dict[str, dict[str, Any]],
    *,
    checkpoint: dict[str, Any],
    chain: list[dict[str, Any]] | None = None,
    task_name: str | None = None,
    figures: Sequence[tuple[str, str]] = (),
    notes: Sequence[str] = (),
) -> str:
    """The evaluation report of a token-classification or regression model as markdown
    (``figures``: ``(caption, file)`` pairs; ``chain``: :func:`pipeline.lineage.chain.provenance_chain`)."""
    title = f"Evaluation: {task_name}" if task_name else "Evaluation"
    task = get_task(task_type)
    kind = task.title
    lines = [
        f"# {title}",
        "",
        f"Task type: {kind}. Written by `python -m stages.evaluate` (DVC stage `evaluate`); "
        "headline numbers in `metrics/eval.json`, all of them in `reports/evaluate.json`, run details in MLflow.",
        "",
    ]
    lines += checkpoint_section(checkpoint, ("recorded", "recorded by fine-tuning"))

    if task.token_level:
        lines += [
            "## Results (entity level, seqeval / conlleval)",
            "",
            "| split | sentences | words | gold entities | precision (%) | recall (%) | F1 (%) | word accuracy (%) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for split, m in results.items():
            lines.append(
                f"| {split} | {m['n']} | {m['words']} | {m['entities']} | {_pct(m['precision'])} | "
                f"{_pct(m['recall'])} | {_pct(m['f1'])} | {_pct(m['accuracy'])} |"
            )
    else:
        lines += [
            "## Results",
            "",
            "| split | pairs | Pearson r | Spearman ρ | MSE | mean gold | mean predicted |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for split, m in results.items():
            lines.append(
                f"| {split} | {m['n']} | {_num(m['pearson'])} | {_num(m['spearman'])} | {_num(m['mse'])} | "
                f"{m['gold_mean']:.3f} | {m['predicted_mean']:.3f} |"
            )
    lines.append("")
    lines += [f"- {note}" for note in notes]
    if notes:
        lines.append("")

    for split, m in results.items():
        names = m["labels"]
        if task.token_level:
            lines += [
                f"### {split}: per entity type",
                "",
                "| type | precision (%) | recall (%) | F1 (%) | support |",
                "|---|---:|---:|---:|---:|",
            ]
            for kind_name, c in m["per_type"].items():
                lines.append(
                    f"| {kind_name} | {_pct(c['precision'])} | {_pct(c['recall'])} | {_pct(c['f1'])} | {c['support']} |"
                )
            lines += ["", f"### {split}: word-level tag confusion (rows gold, columns predicted)", ""]
        else:
            lines += [f"### {split}: rounded grades (rows gold, columns predicted; scores rounded to 0..5)", ""]
        lines += ["| gold \\ predicted | " + " | ".join(str(n) for n in names) + " |", "|---|" + "---:|" * len(names)]
        for name, row in zip(names, m["confusion_matrix"]):
            lines.append(f"| **{name}** | " + " | ".join(str(v) for v in row) + " |")
        lines.append("")
    lines += [f"![{caption}]({file})" for caption, file in figures]
    if figures:
        lines.append("")
    lines += provenance_lines(chain)
    return "\n".join(lines).rstrip() + "\n"


__all__ = [
    "token_results",
    "regression_results",
    "details_for_dvc",
    "summary_for_dvc",
    "write_scatter_csv",
    "plot_scatter",
    "render_task_report",
    "GRADES",
]
