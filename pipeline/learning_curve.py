"""Learning curve: fine-tuned accuracy against minutes of pre-training.

The points are the pre-training snapshots (``pretrain.snapshot_minutes`` keeps the weights at
those elapsed minutes), the final checkpoint, and 0 minutes = the same model fine-tuned from
random weights (``finetune.mode: scratch``). Each is fine-tuned with the ``finetune`` params.
A snapshot taken mid-run has not seen the end of the learning-rate schedule; the final point has.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any, Callable, Sequence

from pipeline.errors import BertraceError
from pipeline.io import atomic_open, atomic_path

COLUMNS = ("pretrain_minutes", "dev_accuracy", "dev_std", "seeds", "steps", "checkpoint")


def curve_points(pretrain_dir: str | Path) -> list[tuple[float, Path | None]]:
    """``[(minutes, checkpoint or None for scratch), ...]`` sorted by minutes."""
    from pipeline import checkpoint as ckpt_lib

    pretrain_dir = Path(pretrain_dir)
    final = next((p for p in (pretrain_dir / "best.pt", pretrain_dir / "last.pt") if p.exists()), None)
    if final is None:
        raise BertraceError(f"{pretrain_dir}: no best.pt or last.pt; run `dvc repro pretrain` first")
    points: list[tuple[float, Path | None]] = [(0.0, None)]
    for path in sorted((pretrain_dir / "snapshots").glob("minute-*.pt")):
        m = re.fullmatch(r"minute-([0-9.]+)\.pt", path.name)
        if m:
            points.append((float(m.group(1)), path))
    final_minutes = float(ckpt_lib.load_checkpoint(final).get("train_seconds") or 0.0) / 60.0
    if all(abs(final_minutes - m) > 0.05 for m, _ in points):
        points.append((round(final_minutes, 2), final))
    return sorted(points, key=lambda p: p[0])


def write_curve_csv(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    with atomic_open(path) as f:
        f.write(buf.getvalue())
    return Path(path)


def plot_curve(path: str | Path, rows: Sequence[dict[str, Any]], *, title: str,
               reference: Sequence[tuple[str, float]] = ()) -> Path:
    """PNG: accuracy (%) against pre-training minutes, error bars = std over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["pretrain_minutes"] for r in rows]
    ys = [100 * r["dev_accuracy"] for r in rows]
    ax.errorbar(xs, ys, yerr=[100 * r["dev_std"] for r in rows], marker="o", capsize=3, label="this project")
    for (label, value), style in zip(reference, ("--", ":", "-.")):
        ax.axhline(value, linestyle=style, color="gray", linewidth=1)
        ax.annotate(f"{label} ({value:g})", (0, value), textcoords="offset points", xytext=(2, 2), fontsize=7,
                    color="gray")
    ax.set_xlabel("pre-training minutes")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return Path(path)


def run_curve(points: Sequence[tuple[float, Path | None]], fine_tune: Callable[[Path | None], dict[str, Any]],
              on_point: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Fine-tune every point with ``fine_tune(checkpoint or None)`` -> finetune summary."""
    rows = []
    for minutes, path in points:
        summary = fine_tune(path)
        acc = summary["validation_accuracy"]
        row = {"pretrain_minutes": minutes, "dev_accuracy": round(acc["mean"], 6), "dev_std": round(acc["std"], 6),
               "seeds": len(summary.get("per_seed") or {}) or 1,
               "steps": sum(int(s.get("steps", 0)) for s in (summary.get("per_seed") or {}).values()),
               "checkpoint": path.as_posix() if path else "scratch"}
        rows.append(row)
        if on_point:
            on_point(row)
    return rows
