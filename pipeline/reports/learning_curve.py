"""Learning curve: fine-tuned accuracy against the amount of pre-training.

The points are the pre-training snapshots, the final checkpoint, and 0 = the same model
fine-tuned from random weights (``finetune.mode: scratch``). Each is fine-tuned with the
``finetune`` params. A snapshot taken mid-run has not seen the end of the learning-rate
schedule; the final point has.

The x axis is pre-training *updates* when the run kept step snapshots (``pretrain.snapshot_steps``,
``snapshots/step-002000.pt``: reproducible) and *minutes* when it kept minute snapshots
(``pretrain.snapshot_minutes``, ``snapshots/minute-015.pt``: wall clock); without snapshots it
follows the run's budget. Every row carries both numbers (``pretrain_steps`` and
``pretrain_minutes``, read from the checkpoints).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Sequence

from pydantic import Field

from pipeline.core.config import Float, Int, Section, Str
from pipeline.core.errors import BertraceError
from pipeline.core.io import atomic_open, atomic_path

# pretrain_sha256: the final pre-trained checkpoint the curve belongs to (reports/plots.html draws the
# curve only while that is the current data/pretrain checkpoint: pipeline/reports/plots.py)
COLUMNS = (
    "pretrain_steps",
    "pretrain_minutes",
    "dev_accuracy",
    "dev_std",
    "seeds",
    "steps",
    "checkpoint",
    "pretrain_sha256",
)
UNITS = {"steps": ("pretrain_steps", "pre-training steps"), "minutes": ("pretrain_minutes", "pre-training minutes")}


class LearningCurveConfig(Section):
    """The ``learning_curve`` section of params.yaml (``make learning-curve``; defaults equal
    params.yaml, tests/unit/core/test_config.py). The fine-tuning itself is ``finetune``'s, with these seeds."""

    SECTION: ClassVar[str] = "learning_curve"

    seeds: list[Annotated[Int, Field(ge=0)]] = Field(default_factory=lambda: [0], min_length=1)
    label: Str | None = None  # the curve's name in reports/learning_curves/ (None: the objective)
    reference: dict[Str, Float] | None = None  # reference lines (None: reports/references.yaml's)


@dataclass(frozen=True)
class Point:
    """One point of the curve: a checkpoint (None: random weights) after ``steps`` updates / ``minutes``."""

    steps: int
    minutes: float
    checkpoint: Path | None

    def x(self, unit: str) -> float:
        return self.steps if unit == "steps" else self.minutes


def curve_points(pretrain_dir: str | Path) -> tuple[str, list[Point]]:
    """``(unit, points)``: unit ``steps`` or ``minutes`` (see the module docstring); points sorted
    along it, scratch first, the final checkpoint (best.pt, else last.pt) last unless a snapshot
    is at the same place."""
    from pipeline.models import checkpoint as ckpt_lib

    pretrain_dir = Path(pretrain_dir)
    final = next((p for p in (pretrain_dir / "best.pt", pretrain_dir / "last.pt") if p.exists()), None)
    if final is None:
        raise BertraceError(f"{pretrain_dir}: no best.pt or last.pt; run `dvc repro pretrain` first")

    def point(path: Path) -> Point:
        state = ckpt_lib.load_checkpoint(path)
        return Point(int(state.get("step") or 0), round(float(state.get("train_seconds") or 0.0) / 60.0, 2), path)

    snaps = pretrain_dir / "snapshots"
    by_step = [p for p in sorted(snaps.glob("step-*.pt")) if re.fullmatch(r"step-[0-9]+\.pt", p.name)]
    by_minute = [p for p in sorted(snaps.glob("minute-*.pt")) if re.fullmatch(r"minute-[0-9.]+\.pt", p.name)]
    last = point(final)
    if by_step:
        unit, paths = "steps", by_step
    elif by_minute:
        unit, paths = "minutes", by_minute
    else:
        budget = ckpt_lib.load_checkpoint(final).get("train_config") or {}
        unit, paths = ("minutes" if budget.get("time_minutes") else "steps"), []
    points = [Point(0, 0.0, None), *(point(p) for p in paths)]
    if unit == "minutes":  # a snapshot at the last minute is the final checkpoint
        points = [
            Point(p.steps, float(re.fullmatch(r"minute-([0-9.]+)\.pt", p.checkpoint.name).group(1)), p.checkpoint)
            if p.checkpoint
            else p
            for p in points
        ]
        if all(abs(last.minutes - p.minutes) > 0.05 for p in points):
            points.append(last)
    elif all(last.steps != p.steps for p in points):
        points.append(last)
    return unit, sorted(points, key=lambda p: p.x(unit))


def write_curve_csv(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    with atomic_open(path) as f:
        f.write(buf.getvalue())
    return Path(path)


def plot_curve(
    path: str | Path,
    series: dict[str, Sequence[dict[str, Any]]],
    *,
    title: str,
    unit: str = "minutes",
    reference: Sequence[tuple[str, float]] = (),
) -> Path:
    """PNG: accuracy (%) against pre-training steps or minutes, one line per series (label -> rows),
    error bars = std over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    column, label = UNITS[unit]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rows in series.items():
        xs = [r[column] for r in rows]
        ys = [100 * r["dev_accuracy"] for r in rows]
        ax.errorbar(xs, ys, yerr=[100 * r["dev_std"] for r in rows], marker="o", capsize=3, label=name)
    for (name, value), style in zip(reference, ("--", ":", "-.")):
        ax.axhline(value, linestyle=style, color="gray", linewidth=1)
        ax.annotate(
            f"{name} ({value:g})", (0, value), textcoords="offset points", xytext=(2, 2), fontsize=7, color="gray"
        )
    ax.set_xlabel(label)
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return Path(path)


def save_series(directory: str | Path, label: str, record: dict[str, Any]) -> Path:
    """Keep one run's curve as ``directory/<label>.json`` (``{label, objective, tokenizer_sha256,
    pretrain_sha256, unit, points}``), so curves of several objectives can share one plot."""
    from pipeline.core.io import write_json

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", label):
        raise BertraceError(f"learning_curve.label {label!r}: use letters, digits, '.', '_' or '-' (it names a file)")
    path = Path(directory) / f"{label}.json"
    write_json(path, {**record, "label": label})
    return path


def read_series(directory: str | Path, tokenizer_sha256: str) -> dict[str, list[dict[str, Any]]]:
    """The saved curves (:func:`save_series`) made with this tokenizer, i.e. on this corpus: label -> points.
    A curve of another corpus or tokenizer is left out (its ids, and its task data, differ)."""
    import json

    out = {}
    for path in sorted(Path(directory).glob("*.json")) if Path(directory).is_dir() else []:
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BertraceError(
                f"{path}: not valid JSON ({e}); delete it and run `make learning-curve` again"
            ) from None
        if rec.get("tokenizer_sha256") == tokenizer_sha256 and rec.get("points"):
            out[str(rec.get("label") or path.stem)] = rec["points"]
    return out


def run_curve(
    points: Sequence[Point],
    fine_tune: Callable[[Path | None], dict[str, Any]],
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Fine-tune every point with ``fine_tune(checkpoint or None)`` -> finetune summary."""
    rows = []
    for p in points:
        summary = fine_tune(p.checkpoint)
        acc = summary["validation_accuracy"]
        row = {
            "pretrain_steps": p.steps,
            "pretrain_minutes": p.minutes,
            "dev_accuracy": round(acc["mean"], 6),
            "dev_std": round(acc["std"], 6),
            "seeds": len(summary.get("per_seed") or {}) or 1,
            "steps": sum(int(s.get("steps", 0)) for s in (summary.get("per_seed") or {}).values()),
            "checkpoint": p.checkpoint.as_posix() if p.checkpoint else "scratch",
        }
        rows.append(row)
        if on_point:
            on_point(row)
    return rows
