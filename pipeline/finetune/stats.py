"""Numbers over fine-tuning seeds: mean ± std, the best seed, the timings (Dodge et al. 2020: fine-tuning
BERT is seed-sensitive, so every result is over several seeds)."""

from __future__ import annotations

import statistics
from typing import Any


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1; 0.0 for a single value)."""
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def best_seed(results: list) -> Any:
    """The SeedResult with the highest selection metric (``score``: validation accuracy, entity F1,
    Pearson r, ... by task type); ties go to the earlier seed in ``seeds``."""
    return max(results, key=lambda r: (r.score, -results.index(r)))


def seed_timings(results: list) -> dict[str, Any]:
    """CPU and wall seconds of each seed and their sums: what the stage logs as timings (MLflow and its
    run log, ``StageRun.log_timings``), never part of a DVC output."""
    return {
        "cpu_seconds": round(sum(r.cpu_seconds for r in results), 3),
        "wall_seconds": round(sum(r.wall_seconds for r in results), 3),
        "per_seed": {
            str(r.seed): {"cpu_seconds": round(r.cpu_seconds, 3), "wall_seconds": round(r.wall_seconds, 3)}
            for r in results
        },
    }


__all__ = ["best_seed", "mean_std", "seed_timings"]
