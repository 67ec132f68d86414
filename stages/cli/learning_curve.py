"""`make learning-curve`: fine-tuned accuracy against the amount of pre-training.

Fine-tunes (``finetune`` params, seeds from ``learning_curve.seeds``) every pre-training
snapshot in ``data/pretrain/snapshots/`` (``pretrain.snapshot_steps``, or the wall-clock
``pretrain.snapshot_minutes``), the final checkpoint, and the same model from random weights
(0 steps). The x axis is pre-training steps (minutes for minute snapshots). Writes
``plots/learning_curve.csv`` (a DVC plot: ``dvc plots show``), ``reports/learning_curve.png``
and ``metrics/learning_curve.json``, and logs an MLflow run. The curve is also kept as
``reports/learning_curves/<label>.json`` (``learning_curve.label``, default the objective), and
the PNG draws every kept curve of the same tokenizer (so corpus) against pre-training minutes:
run it after an ``electra`` and after an ``mlm_nsp`` pre-training to compare the two. Not a stage of ``dvc repro``: it
costs one fine-tuning per point, more than the default 60-minute budget allows.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.io import sha256_file, write_json
from pipeline.data.hub import configured_mirror
from pipeline.data.tokenizer import load_tokenizer
from pipeline.finetune.loop import FinetuneConfig, finetune
from pipeline.finetune.task_data import load_task_data
from pipeline.models.checkpoint import check_checkpoint_tokenizer, checkpoint_objective, load_pretrained
from pipeline.reports.learning_curve import (
    LearningCurveConfig,
    curve_points,
    plot_curve,
    read_series,
    run_curve,
    save_series,
    write_curve_csv,
)
from pipeline.reports.scorecard import read_references
from stages.common import StageRun, load_params, run_stage

PRETRAIN_DIR = Path("data/pretrain")
TOKENIZER = Path("data/tokenizer/tokenizer.json")
CSV = Path("plots/learning_curve.csv")
PNG = Path("reports/learning_curve.png")
METRICS = Path("metrics/learning_curve.json")
SERIES_DIR = Path("reports/learning_curves")  # one <label>.json per run: the PNG draws those of this corpus


def main(progress: bool = True) -> dict:
    cfg = LearningCurveConfig.from_params(load_params("learning_curve"))
    ft = FinetuneConfig.from_params({**load_params("finetune"), "seeds": cfg.seeds})
    mirror = configured_mirror(ft.mirror)
    tokenizer_path = Path(ft.tokenizer or TOKENIZER)
    unit, points = curve_points(PRETRAIN_DIR)
    # reference lines: learning_curve.reference, else reports/references.yaml's learning_curve
    reference = cfg.reference or read_references().get("learning_curve") or {}
    column = "pretrain_steps" if unit == "steps" else "pretrain_minutes"

    # reference names are free text, not valid MLflow param names: one list value
    run_params = {**cfg.to_dict(), "reference": [[k, v] for k, v in reference.items()], "finetune": ft.to_dict()}
    with StageRun("learning_curve", run_params) as run:
        data = load_task_data(
            ft.task,
            load_tokenizer(tokenizer_path),
            max_len=ft.max_len,
            truncation=ft.truncation,
            mirror=mirror,
            roles=("train", "validation"),
            progress=progress,
        )
        final = points[-1].checkpoint
        final_ckpt = load_pretrained(final)

        def fine_tune(path):
            ckpt = final_ckpt if path in (None, final) else load_pretrained(path)  # final: loaded once
            check_checkpoint_tokenizer(ckpt, path or final, tokenizer_path)
            if path is not None:
                run.add_input(path)
            mode = "scratch" if path is None else ft.mode
            seed_cfg = ft.model_copy(update={"mode": mode})
            print(f"learning curve: fine-tuning {path or 'from random weights (no pre-training)'}")
            summary, _ = finetune(ckpt, data, seed_cfg, progress=progress, source=str(path or final))
            return summary

        def on_point(row):
            print(
                f"learning curve: {row[column]:g} {unit} -> {100 * row['dev_accuracy']:.2f} "
                f"± {100 * row['dev_std']:.2f} %"
            )
            # MLflow steps are integers: pre-training updates, or seconds for a minutes axis
            x = row["pretrain_steps"] if unit == "steps" else int(round(row["pretrain_minutes"] * 60))
            run.log_metrics({"dev_accuracy": row["dev_accuracy"]}, step=x)

        rows = run_curve(points, fine_tune, on_point)
        return _save_curve(run, cfg, ft, rows, reference, final, checkpoint_objective(final_ckpt), unit)


def _save_curve(run, cfg, ft, rows: list[dict], reference: dict, final: Path, objective: str, unit: str) -> dict:
    """Write the curve (CSV, this run's series, the PNG of every series of this corpus, metrics) and log them."""
    final_sha256 = sha256_file(final)  # which pre-training run the curve belongs to (bertrace plots checks it)
    write_curve_csv(CSV, [{**r, "pretrain_sha256": final_sha256} for r in rows])
    label = cfg.label or objective
    tokenizer_sha = sha256_file(Path(ft.tokenizer or TOKENIZER))
    series_path = save_series(
        SERIES_DIR,
        label,
        {
            "objective": objective,
            "tokenizer_sha256": tokenizer_sha,
            "pretrain_sha256": final_sha256,
            "unit": unit,
            "points": rows,
        },
    )
    run.add_output(series_path)
    series = read_series(SERIES_DIR, tokenizer_sha)  # this run's and earlier runs' on the same corpus
    if len(series) > 1:  # objectives differ in cost per update: compare them per minute of pre-training
        unit = "minutes"
    task = ft.task.hub.config or "task"
    plot_curve(
        PNG,
        series,
        reference=[(name, float(v)) for name, v in reference.items()],
        unit=unit,
        title=f"{task} validation accuracy vs pre-training {unit} ({len(ft.seeds)} seed(s) per point)",
    )
    metrics = {
        "unit": unit,
        "pretrain_checkpoint": {"path": final.as_posix(), "sha256": final_sha256},
        "label": label,
        "objective": objective,
        "points": rows,
        "plotted": sorted(series),
    }
    write_json(METRICS, metrics)
    for path in (CSV, PNG, METRICS):
        run.add_output(path)
        run.log_artifact(path, "learning_curve")
    run.write_provenance()
    return metrics


if __name__ == "__main__":
    run_stage(main)
