"""Evaluation of a fine-tuned classifier: metrics, confusion matrix, plot, markdown report.

Metrics are computed with numpy and follow scikit-learn's definitions (the tests compare
against ``sklearn.metrics`` on the same predictions): per-class precision tp / (tp + fp),
recall tp / (tp + fn), F1 2tp / (2tp + fp + fn), each 0 when its denominator is 0
(``zero_division=0``); macro F1 is the unweighted mean over *all* classes of the task
(``labels=range(num_labels)``, so a class that is never predicted counts with F1 0), weighted
F1 weights each class by its support.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Sequence

import numpy as np
from pydantic import Field, field_serializer, field_validator

from pipeline.core.config import Bool, Int, Section, Str
from pipeline.core.errors import BertraceError
from pipeline.core.io import atomic_open, atomic_path
from pipeline.evaluate.fonts import LabelFonts, label_fonts, set_families


class EvaluateConfig(Section):
    """The ``evaluate`` section of params.yaml (defaults equal params.yaml; tests/unit/core/test_config.py)."""

    SECTION: ClassVar[str] = "evaluate"

    # task roles to score; auto: validation, and test when finetune.task.splits.test names a split
    splits: Annotated[list[Literal["train", "validation", "test"]], Field(min_length=1)] = "auto"
    batch_size: Annotated[Int, Field(ge=1)] = 128
    device: Str = "auto"
    log_model: Bool = True  # the classifier as an MLflow pyfunc model
    registered_model_name: Str | None = None  # also register it in the MLflow Model Registry
    run_name: Str = "this run"  # this run's row in reports/scorecard.md

    @field_validator("splits", mode="wrap")
    @classmethod
    def _auto(cls, value, handler):
        if value == "auto":
            return value
        if isinstance(value, str):
            raise ValueError("must be auto or a list of task roles, e.g. [validation, test]")
        return handler(value)

    @field_serializer("splits")
    def _splits(self, value):
        return value if value == "auto" else list(value)

    @field_validator("registered_model_name")
    @classmethod
    def _model_name(cls, value):
        if value is not None and (
            not value.strip() or any(c in value for c in "/:") or value.startswith(".") or value != value.strip()
        ):
            raise ValueError(
                "an MLflow model name cannot be empty, contain '/' or ':', start with '.' or "
                "space, or end with a space; choose another name"
            )
        return value


# --------------------------------------------------------------------------------------------
# Metrics


def confusion_matrix(y_true: Sequence[int], y_pred: Sequence[int], num_labels: int) -> np.ndarray:
    """``cm[i, j]`` = number of examples with actual class ``i`` predicted as ``j`` (int64)."""
    t = np.asarray(y_true, dtype=np.int64).reshape(-1)
    p = np.asarray(y_pred, dtype=np.int64).reshape(-1)
    if t.shape != p.shape:
        raise BertraceError(f"evaluation: {t.size} labels but {p.size} predictions")
    for name, arr in (("labels", t), ("predictions", p)):
        if arr.size and (arr.min() < 0 or arr.max() >= num_labels):
            raise BertraceError(
                f"evaluation: {name} must be class ids in [0, {num_labels}), found "
                f"{int(arr.min())}..{int(arr.max())}; does the task data use the checkpoint's label set?"
            )
    return np.bincount(t * num_labels + p, minlength=num_labels * num_labels).reshape(num_labels, num_labels)


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def classification_metrics(y_true: Sequence[int], y_pred: Sequence[int], label_names: Sequence[str]) -> dict[str, Any]:
    """Accuracy, macro / weighted F1, per-class precision / recall / F1 / support, confusion matrix.

    Returns plain Python numbers: ``{"n", "accuracy", "macro_f1", "weighted_f1",
    "macro_precision", "macro_recall", "per_class": {name: {precision, recall, f1, support}},
    "confusion_matrix": [[...]] (rows actual, columns predicted), "labels": [names]}``.
    """
    k = len(label_names)
    if k < 2:
        raise BertraceError(f"evaluation: need at least 2 classes, got label names {list(label_names)}")
    cm = confusion_matrix(y_true, y_pred, k)
    n = int(cm.sum())
    if n == 0:
        raise BertraceError("evaluation: no examples to evaluate (the split is empty)")
    tp = np.diag(cm).astype(np.float64)
    support = cm.sum(axis=1).astype(np.float64)  # actual
    predicted = cm.sum(axis=0).astype(np.float64)  # predicted
    precision = _safe_div(tp, predicted)
    recall = _safe_div(tp, support)
    f1 = _safe_div(2 * tp, support + predicted)  # = 2tp / (2tp + fp + fn)
    return {
        "n": n,
        "accuracy": float(tp.sum() / n),
        "macro_f1": float(f1.mean()),
        "weighted_f1": float((f1 * support).sum() / support.sum()),
        "macro_precision": float(precision.mean()),
        "macro_recall": float(recall.mean()),
        "per_class": {
            name: {
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "f1": float(f1[i]),
                "support": int(support[i]),
            }
            for i, name in enumerate(label_names)
        },
        "confusion_matrix": cm.tolist(),
        "labels": list(label_names),
    }


def evaluate_logits(logits: np.ndarray, labels: Sequence[int], label_names: Sequence[str]) -> dict[str, Any]:
    """:func:`classification_metrics` of ``argmax(logits)``, plus ``loss`` (mean cross-entropy)
    and ``majority_accuracy`` (always predicting the split's most frequent class)."""
    logits = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    if logits.ndim != 2 or logits.shape != (y.size, len(label_names)):
        raise BertraceError(
            f"evaluation: logits of shape {logits.shape} for {y.size} labels and {len(label_names)} classes"
        )
    m = classification_metrics(y, logits.argmax(axis=1), label_names)
    z = logits - logits.max(axis=1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    m["loss"] = float(-log_probs[np.arange(y.size), y].mean())
    m["majority_accuracy"] = float(np.bincount(y, minlength=len(label_names)).max() / y.size)
    return m


def metrics_for_dvc(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per split, the numeric metrics only (no matrix, no names): what ``dvc metrics`` shows."""
    out: dict[str, Any] = {}
    for split, m in results.items():
        out[split] = {
            key: m[key]
            for key in (
                "n",
                "accuracy",
                "macro_f1",
                "weighted_f1",
                "macro_precision",
                "macro_recall",
                "loss",
                "majority_accuracy",
            )
            if key in m
        }
        out[split]["per_class"] = m["per_class"]
    return out


SPLIT_SHORT = {"validation": "dev", "test": "test"}  # metrics/eval.json key prefixes


def evaluation_summary(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The few numbers of ``metrics/eval.json`` (``dvc exp show`` columns): macro F1 per split and
    the accuracy of the held-out ones (``dev_f1``, ``test_acc``, ``test_f1``); the dev accuracy a
    user compares is fine-tuning's mean ± std over seeds (``metrics/finetune.json`` ``dev_acc``,
    ``dev_std``: no key may repeat across metrics files, or ``dvc exp show`` prefixes it with the
    file's path). Every number is in ``reports/evaluate.json``."""
    out: dict[str, float] = {}
    for split, m in results.items():
        for key, short in (("accuracy", "acc"), ("macro_f1", "f1")):
            if key in m and not (split == "validation" and key == "accuracy"):
                out[f"{SPLIT_SHORT.get(split, split)}_{short}"] = m[key]
    return out


MAJORITY_MARGIN = 0.01  # accuracy within 1 point of always predicting the majority class: a warning


def collapse_warnings(results: dict[str, dict[str, Any]]) -> list[str]:
    """One line per split where the classifier learned (next to) nothing: every prediction is one
    class, or accuracy is within :data:`MAJORITY_MARGIN` of the majority-class baseline (a model
    that predicts one class for everything scores about that, e.g. macro F1 ~34 % on 2 classes)."""
    warnings = []
    for split, m in results.items():
        cm, labels = m.get("confusion_matrix"), m.get("labels")
        if cm is None or "accuracy" not in m:
            continue
        predicted = np.asarray(cm).sum(axis=0)
        used = [labels[i] for i in np.flatnonzero(predicted)]
        if len(used) == 1 and len(labels) > 1:
            warnings.append(
                f"{split}: every prediction is '{used[0]}' (predictions collapsed to one class; "
                f"accuracy {100 * m['accuracy']:.1f} %, macro F1 {100 * m['macro_f1']:.1f} %)"
            )
        elif "majority_accuracy" in m and m["accuracy"] <= m["majority_accuracy"] + MAJORITY_MARGIN:
            warnings.append(
                f"{split}: accuracy {100 * m['accuracy']:.1f} % is within "
                f"{100 * MAJORITY_MARGIN:.0f} point of always predicting the majority class "
                f"({100 * m['majority_accuracy']:.1f} %)"
            )
    return warnings


# --------------------------------------------------------------------------------------------
# Confusion data (DVC plot) and picture


def write_confusion_csv(
    path: str | Path, y_true: Sequence[int], y_pred: Sequence[int], label_names: Sequence[str]
) -> Path:
    """One row per example, columns ``actual,predicted`` (label names), for DVC's
    ``confusion`` template (x: predicted, y: actual)."""
    path = Path(path)
    with atomic_open(path) as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["actual", "predicted"])
        for t, p in zip(y_true, y_pred):
            w.writerow([label_names[int(t)], label_names[int(p)]])
    return path


def plot_confusion(
    path: str | Path, cm: Sequence[Sequence[int]], label_names: Sequence[str], title: str = "Confusion matrix"
) -> Path:
    """PNG of :func:`confusion_figure`. When its ticks show class indices, the PNG's
    ``Description`` text names the classes, one ``index = name`` a line."""
    fonts = label_fonts([str(n) for n in label_names])
    fig = confusion_figure(cm, label_names, title, fonts=fonts)
    metadata = None if fonts.on_ticks else {"Description": class_key(label_names)}
    return save_figure(fig, path, metadata=metadata)


def confusion_figure(
    cm: Sequence[Sequence[int]],
    label_names: Sequence[str],
    title: str = "Confusion matrix",
    fonts: LabelFonts | None = None,
):
    """The confusion matrix as a matplotlib ``Figure``: cells coloured by row share (recall),
    annotated with counts.

    ``fonts`` (default: :func:`label_fonts` of the names) decides how the classes are named.
    Where :attr:`LabelFonts.on_ticks`, the ticks show the names, each in its fonts. Otherwise
    the ticks show class indices 0..K-1 and: when every name has fonts (matplotlib does not
    shape text), a key beside the matrix lists ``index = name``; when some name has a character
    no candidate font has (:mod:`pipeline.evaluate.fonts`: matplotlib's own, whatever the host
    has), the x label says the names are in the evaluation report (whose class tables list them
    in index order). Every character drawn has a glyph in its fonts, so matplotlib warns of no
    missing glyph.

    Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend switch).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    names = [str(n) for n in label_names]
    fonts = label_fonts(names) if fonts is None else fonts
    cm = np.asarray(cm, dtype=np.int64)
    k = len(names)
    share = _safe_div(cm, cm.sum(axis=1, keepdims=True).repeat(k, axis=1))
    size = max(3.5, 0.9 * k + 2.0)
    key = fonts.families is not None and not fonts.on_ticks
    fig = Figure(figsize=(size + (3.0 if key else 1.0), size), dpi=120)
    FigureCanvasAgg(fig)
    if key:
        grid = fig.add_gridspec(1, 2, width_ratios=[size + 1.0, 2.0])
        ax, key_ax = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    else:
        ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(share, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share of actual class")
    if fonts.on_ticks:
        ax.set_xticks(range(k), labels=names, rotation=45 if k > 4 else 0, ha="right" if k > 4 else "center")
        ax.set_yticks(range(k), labels=names)
        for ticks in (ax.get_xticklabels(), ax.get_yticklabels()):
            set_families(ticks, fonts.families)
        ax.set_xlabel("predicted")
        ax.set_ylabel("actual")
    else:
        indices = [str(i) for i in range(k)]
        ax.set_xticks(range(k), labels=indices)
        ax.set_yticks(range(k), labels=indices)
        ax.set_xlabel(
            "predicted (class index)"
            if key
            else "predicted (class index)\nclass names: see the evaluation report\n(matplotlib's own fonts lack their glyphs)"
        )
        ax.set_ylabel("actual (class index)")
    if key:
        key_ax.axis("off")
        handles = [Rectangle((0, 0), 0, 0, visible=False) for _ in names]
        lines = class_key(names).splitlines()
        legend = key_ax.legend(handles, lines, loc="center left", title="classes", handlelength=0, handletextpad=0)
        set_families(legend.get_texts(), fonts.families)
    ax.set_title(title)
    for i in range(k):
        for j in range(k):
            ax.text(
                j,
                i,
                f"{cm[i, j]}\n{share[i, j]:.1%}",
                ha="center",
                va="center",
                fontsize=9,
                color="white" if share[i, j] > 0.5 else "black",
            )
    return fig


def class_key(label_names: Sequence[str]) -> str:
    """``index = name``, one class a line."""
    return "\n".join(f"{i} = {name}" for i, name in enumerate(label_names))


def save_figure(fig, path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """Lay out ``fig`` and write it as a PNG, atomically. ``metadata``: PNG text chunks besides
    matplotlib's ``Software``."""
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata=metadata)
    return path


# --------------------------------------------------------------------------------------------
# Markdown report


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def _short(h: str | None, n: int = 12) -> str:
    return f"`{h[:n]}`" if h else "—"


def checkpoint_section(checkpoint: dict[str, Any], recorded: tuple[str, str]) -> list[str]:
    """An evaluation report's "Checkpoint" table: the rows ``checkpoint`` has, hashes and path as code;
    ``recorded`` is the (key, label) of what fine-tuning recorded for this task type."""
    lines = ["## Checkpoint", "", "| | |", "|---|---|"]
    for key, label in (
        ("path", "file"),
        ("sha256", "sha256"),
        ("tokenizer_sha256", "tokenizer sha256"),
        ("mode", "fine-tuning mode"),
        ("seed", "seed"),
        ("num_parameters", "parameters"),
        ("model", "model"),
        ("task", "task"),
        recorded,
    ):
        if checkpoint.get(key) is not None:
            value = checkpoint[key]
            value = f"`{value}`" if key in ("path", "sha256", "tokenizer_sha256") else value
            lines.append(f"| {label} | {value} |")
    return lines + [""]


def render_report(
    results: dict[str, dict[str, Any]],
    *,
    checkpoint: dict[str, Any],
    baselines: dict[str, float] | None = None,
    chain: list[dict[str, Any]] | None = None,
    task_name: str | None = None,
    figure: str | None = None,
    notes: Sequence[str] = (),
    warnings: Sequence[str] = (),
) -> str:
    """The evaluation report as markdown (``warnings``: :func:`collapse_warnings`, shown first).

    ``results``: ``{split: classification_metrics(...)}``. ``checkpoint``: facts about the
    evaluated model (``path``, ``sha256``, ``tokenizer_sha256``, ``mode``, ``seed``, ``task``,
    ``num_parameters``). ``baselines``: published accuracies in percent, ``{name: value}``.
    ``chain``: :func:`pipeline.lineage.chain.provenance_chain` of the checkpoint.
    """
    title = f"Evaluation: {task_name}" if task_name else "Evaluation"
    lines = [
        f"# {title}",
        "",
        "Written by `python -m stages.evaluate` (DVC stage `evaluate`); numbers in "
        "`metrics/eval.json` (all of them: `reports/evaluate.json`), run details in MLflow.",
        "",
    ]
    lines += [f"> **Warning** — {w}" for w in warnings] + ([""] if warnings else [])

    lines += checkpoint_section(
        checkpoint, ("recorded_validation_accuracy", "validation accuracy recorded by fine-tuning")
    )

    lines += [
        "## Results",
        "",
        "| split | examples | accuracy (%) | macro F1 (%) | weighted F1 (%) | loss |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for split, m in results.items():
        loss = f"{m['loss']:.4f}" if "loss" in m else "—"
        lines.append(
            f"| {split} | {m['n']} | {_pct(m['accuracy'])} | {_pct(m['macro_f1'])} | "
            f"{_pct(m['weighted_f1'])} | {loss} |"
        )
    lines.append("")
    lines += [f"- {note}" for note in notes]
    if notes:
        lines.append("")

    for split, m in results.items():
        names = m["labels"]
        lines += [
            f"### {split}: per class",
            "",
            "| class | precision (%) | recall (%) | F1 (%) | support |",
            "|---|---:|---:|---:|---:|",
        ]
        for name in names:
            c = m["per_class"][name]
            lines.append(
                f"| {name} | {_pct(c['precision'])} | {_pct(c['recall'])} | {_pct(c['f1'])} | {c['support']} |"
            )
        lines += [
            "",
            f"### {split}: confusion matrix (rows actual, columns predicted)",
            "",
            "| actual \\ predicted | " + " | ".join(str(n) for n in names) + " |",
            "|---|" + "---:|" * len(names),
        ]
        for name, row in zip(names, m["confusion_matrix"]):
            lines.append(f"| **{name}** | " + " | ".join(str(v) for v in row) + " |")
        lines.append("")
    if figure:
        lines += [f"![confusion matrix]({figure})", ""]

    rows = [(f"**this model ({split})**", 100 * m["accuracy"]) for split, m in results.items()]
    rows += [
        (f"majority class ({split}, computed)", 100 * m["majority_accuracy"])
        for split, m in results.items()
        if "majority_accuracy" in m
    ]
    rows += [(str(name), float(value)) for name, value in (baselines or {}).items()]
    lines += ["## Compared with baselines", "", "| model | accuracy (%) |", "|---|---:|"]
    lines += [f"| {name} | {value:.1f} |" for name, value in sorted(rows, key=lambda r: -r[1])]
    lines.append("")
    if not baselines:
        lines += [
            "Published numbers and measured anchors: `reports/scorecard.md` (from `reports/references.yaml`).",
            "",
        ]
    if baselines:
        lines += [
            "Published numbers come from their papers: other "
            "test sets, model sizes, pre-training corpora and compute. They are a reference point, "
            "not a like-for-like comparison.",
            "",
        ]

    lines += provenance_lines(chain)
    if chain:
        for e in chain:
            if e["hashes"]:
                lines.append(f"**{e['stage']}**")
                lines.append("")
                lines += [f"- {what}: `{digest}`" for what, digest in sorted(e["hashes"].items())]
                lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def provenance_lines(chain: list[dict[str, Any]] | None) -> list[str]:
    """An evaluation report's "Provenance" section: the chain the checkpoint embeds, each stage's params
    hash. Which commit ran each stage, and when: the run logs (``bertrace trace data/finetune/model.pt``)."""
    lines = ["## Provenance", ""]
    if not chain:
        return lines + ["The checkpoint carries no provenance record.", ""]
    return lines + [
        " → ".join(e["stage"] for e in chain),
        "",
        "| stage | params hash | record from |",
        "|---|---|---|",
        *(f"| {e['stage']} | {_short(e['params_hash'])} | {e.get('source') or '—'} |" for e in chain),
        "",
        "Which commit ran each stage, where and when: `bertrace trace data/finetune/model.pt` (the run logs).",
        "",
    ]


def write_evaluation_report(path: str | Path, text: str) -> Path:
    with atomic_open(path) as f:
        f.write(text)
    return Path(path)
