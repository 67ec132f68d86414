"""DVC stage `evaluate`: the fine-tuned classifier on the task's held-out splits.

Loads ``data/finetune/model.pt`` (+ its ``tokenizer.json``), re-reads the task data named by
``finetune.task`` (through ``pipeline.finetune.task_data``, encoded with the checkpoint's max_len and
truncation) and writes ``metrics/eval.json`` (dev/test accuracy and macro F1; every number in
``reports/evaluate.json``), ``plots/confusion.csv`` (DVC confusion plot),
``reports/confusion.png``, ``reports/evaluation.md`` and ``data/provenance/evaluate.json``.
The MLflow run gets the same numbers, the files, and the model as an MLflow pyfunc
(artifact path ``model``: ``mlflow.pyfunc.load_model("runs:/<run id>/model")``).

Every output is a function of the checkpoint, the task data, the reports it reads and the params:
the provenance shown and the scorecard row come from the chain ``model.pt`` embeds (data and params
hashes, no commits or times), never from ``data/provenance/`` or the run logs, which are no deps.
"""

from __future__ import annotations

import stages.arithmetic  # noqa: F401  (first: params.yaml compute's CPU kernel pins, set before torch loads)

# isort: split
from pathlib import Path

import torch

from pipeline.core.device import apply_arithmetic, resolve_device
from pipeline.core.errors import BertraceError
from pipeline.core.io import read_json, write_json
from pipeline.data.hub import configured_mirror
from pipeline.evaluate.inference import Classifier
from pipeline.evaluate.report import (
    EvaluateConfig,
    collapse_warnings,
    evaluation_summary,
    metrics_for_dvc,
    plot_confusion,
    render_report,
    write_confusion_csv,
    write_evaluation_report,
)
from pipeline.evaluate.scoring import checkpoint_facts, score_classification, score_task
from pipeline.finetune.task_data import evaluate_roles, load_task_data
from pipeline.finetune.tasks.base import TaskType
from pipeline.lineage.chain import provenance_chain
from pipeline.reports.scorecard import SCORECARD_JSON, chain_records, run_row, write_run_row
from pipeline.reports.scorecard import task_name as scorecard_task
from stages.arithmetic import compute_config
from stages.common import DETAILS_DIR, StageRun, load_params, run_stage

MODEL = Path("data/finetune/model.pt")
METRICS = Path("metrics/eval.json")
DETAILS = Path("reports/evaluate.json")
CONFUSION_CSV = Path("plots/confusion.csv")
CONFUSION_PNG = Path("reports/confusion.png")
SCATTER_CSV = Path("plots/scatter.csv")  # regression: predicted vs gold (DVC scatter plot); else header only
SCATTER_PNG = Path("reports/scatter.png")
REPORT = Path("reports/evaluation.md")


def _metrics_file(stage: str) -> dict:
    path = DETAILS_DIR / f"{stage}.json"  # all of the stage's numbers
    return read_json(path) if path.exists() else {}


def main(progress: bool = True) -> dict:
    params = load_params("evaluate")
    cfg = EvaluateConfig.from_params(params)
    finetune_params = load_params("finetune")
    task = finetune_params.get("task")
    mirror = configured_mirror(finetune_params.get("mirror"))
    model_path = MODEL
    splits = evaluate_roles(task, cfg.splits)  # auto: the task's own roles
    compute = compute_config()
    apply_arithmetic(compute)
    threads = int(finetune_params.get("threads") or 0)  # the fine-tuned model runs as it was trained
    if threads > 0:
        torch.set_num_threads(threads)
    run_params = {**params, "task": task, "compute": compute.to_dict()}

    with StageRun("evaluate", run_params) as run:
        clf = Classifier.load(model_path, device=resolve_device(cfg.device, param="evaluate.device"))
        ckpt_sha = run.add_input(model_path)
        tok_sha = run.add_input(model_path.parent / "tokenizer.json")
        run.add_upstream("finetune")
        run.set_tags({"bertrace.finetune_checkpoint_sha256": ckpt_sha, "bertrace.tokenizer_sha256": tok_sha})
        data = load_task_data(
            task,
            clf.tokenizer,
            max_len=clf.max_len,
            truncation=clf.truncation,
            mirror=mirror,
            roles=splits,
            progress=progress,
        )
        for path, digest in data.files.items():
            run.add_input(path, digest)
        if data.label_names != clf.label_names:
            raise BertraceError(
                f"params.yaml: finetune.task.label_names {data.label_names} differ from the labels "
                f"{clf.label_names} that {model_path} was trained with; evaluate with the task it "
                "was fine-tuned on (rerun dvc repro finetune)"
            )
        if clf.task.evaluation != "accuracy":  # NER / regression: pipeline/evaluate/tasks.py
            return _evaluate_task(run, cfg, clf, data, splits, model_path, ckpt_sha, tok_sha, progress)

        return _evaluate_classification(run, cfg, clf, data, splits, model_path, ckpt_sha, tok_sha, progress)


def _evaluate_classification(
    run: StageRun,
    cfg: EvaluateConfig,
    clf: Classifier,
    data,
    splits: list[str],
    model_path: Path,
    ckpt_sha: str,
    tok_sha: str,
    progress: bool,
) -> dict:
    """The evaluate stage for ``classification`` checkpoints: scores, the confusion figure, the
    report, the metrics and this run's scorecard row."""
    scores = score_classification(clf, data, splits, cfg.batch_size, progress)
    results, notes, primary = scores.results, scores.notes, scores.primary
    labels, preds = scores.outputs[primary]
    write_confusion_csv(CONFUSION_CSV, labels, preds, clf.label_names)
    plot_confusion(
        CONFUSION_PNG,
        results[primary]["confusion_matrix"],
        clf.label_names,
        title=f"{primary}: accuracy {results[primary]['accuracy']:.1%} (n={results[primary]['n']})",
    )
    _no_scatter(clf.task_type)

    chain = provenance_chain(clf.checkpoint.get("provenance"), "finetune")
    task_name = scorecard_task((clf.checkpoint.get("task") or {}).get("source") or {})  # its own goal only
    facts = {
        **checkpoint_facts(clf, model_path, ckpt_sha, tok_sha),
        "task": f"{' + '.join(clf.text_columns)} → {', '.join(clf.label_names)} (max_len {clf.max_len}, "
        f"{clf.truncation} truncation)",
        "recorded_validation_accuracy": (clf.checkpoint.get("metrics") or {}).get("validation_accuracy"),
    }
    warnings = collapse_warnings(results)  # one class for everything / at the majority baseline
    for w in warnings:
        print(f"evaluate: warning: {w}")
    report = render_report(
        results,
        checkpoint=facts,
        chain=chain,
        task_name=task_name,
        figure=CONFUSION_PNG.name,
        notes=notes,
        warnings=warnings,
    )
    write_evaluation_report(REPORT, report)

    metrics = metrics_for_dvc(results)
    write_json(DETAILS, metrics)  # every number; METRICS: the few a user compares
    write_json(METRICS, evaluation_summary(results))

    write_run_row(_scorecard_row(cfg.run_name, clf, metrics, task_name, warnings))
    run.log_metrics(metrics)  # per-class names are label names: StageRun makes them valid MLflow keys
    _finish(run, cfg, model_path, chain)
    summary = ", ".join(
        f"{role} accuracy {m['accuracy']:.4f} (macro F1 {m['macro_f1']:.4f}, n={m['n']})" for role, m in results.items()
    )
    print(f"evaluate: {summary} -> {REPORT}")
    return metrics


def _scorecard_row(
    name: str, clf: Classifier, metrics: dict, task_name: str | None, warnings: list[str]
) -> dict | None:
    """This run's scorecard row (the `scorecard` stage draws it beside recorded profiles and
    references); None, said on the console, when the chain lacks what a row needs."""
    try:
        return run_row(
            name,
            records=chain_records(clf.checkpoint.get("provenance")),
            finetune_metrics=_metrics_file("finetune"),
            eval_metrics=metrics,
            pretrain_metrics=_metrics_file("pretrain"),
            model_config=clf.checkpoint.get("model_config"),
            task=task_name,
            warnings=warnings,
        )
    except BertraceError as why:  # e.g. a checkpoint evaluated outside a full pipeline run
        print(f"evaluate: no scorecard row for this run: {why}")
        return None


def _no_scatter(task_type: str) -> None:
    """The declared scatter outputs for a task type without scores: a header-only CSV and a PNG
    that says so (DVC needs every declared output)."""
    from pipeline.evaluate.tasks import plot_scatter, write_scatter_csv

    write_scatter_csv(SCATTER_CSV, None, None)
    plot_scatter(
        SCATTER_PNG,
        None,
        None,
        message=f"No scatter plot: this is a {task_type.replace('_', ' ')} "
        "task (predicted vs gold is drawn for regression); see "
        "confusion.png",
    )


def _finish(run: StageRun, cfg: EvaluateConfig, model_path: Path, chain: list[dict]) -> None:
    """Record and log the declared files, the pyfunc model (``evaluate.log_model``) and the record."""
    for path in (CONFUSION_CSV, CONFUSION_PNG, SCATTER_CSV, SCATTER_PNG, REPORT, SCORECARD_JSON, DETAILS):
        run.add_output(path)
        run.log_artifact(path, "evaluation")
    if cfg.log_model and run.mlflow_run_id is not None:
        from pipeline.interop.pyfunc import log_pyfunc

        info = log_pyfunc(model_path, "model", registered_model_name=cfg.registered_model_name or None)
        run.set_tags({"bertrace.pyfunc_model_uri": info.model_uri})
    run.add_fields({"chain": [e["stage"] for e in chain]})
    run.write_provenance()


def _task_figures(task: TaskType, primary: str, m: dict, gold, pred, label_names: list[str]) -> list[tuple[str, str]]:
    """The confusion (and, for regression, scatter) files of a token-classification or regression
    run; returns the report's figure list."""
    from pipeline.evaluate.tasks import GRADES, plot_scatter, write_scatter_csv

    if task.token_level:
        write_confusion_csv(CONFUSION_CSV, gold, pred, label_names)
        plot_confusion(
            CONFUSION_PNG,
            m["confusion_matrix"],
            label_names,
            title=f"{primary}: word tags, entity F1 {m['f1']:.1%} (n={m['n']} sentences)",
        )
        _no_scatter(task.name)
        return [("word-level tag confusion", CONFUSION_PNG.name)]
    from pipeline.finetune.task_metrics import score_buckets

    write_confusion_csv(CONFUSION_CSV, score_buckets(gold), score_buckets(pred), GRADES)
    plot_confusion(
        CONFUSION_PNG, m["confusion_matrix"], GRADES, title=f"{primary}: grades rounded to 0..5 (n={m['n']})"
    )
    write_scatter_csv(SCATTER_CSV, pred, gold)
    plot_scatter(
        SCATTER_PNG,
        pred,
        gold,
        title=f"{primary}: Pearson {m['pearson']:.3f}, Spearman {m['spearman']:.3f} (n={m['n']})",
    )
    return [("predicted vs gold", SCATTER_PNG.name), ("rounded grades", CONFUSION_PNG.name)]


def _evaluate_task(
    run: StageRun,
    cfg: EvaluateConfig,
    clf: Classifier,
    data,
    splits: list[str],
    model_path: Path,
    ckpt_sha: str,
    tok_sha: str,
    progress: bool,
) -> dict:
    """The evaluate stage for ``token_classification`` and ``regression`` checkpoints: the same
    declared files as classification (see :mod:`pipeline.evaluate.tasks`)."""
    from pipeline.evaluate.tasks import details_for_dvc, render_task_report, summary_for_dvc

    task_type = clf.task_type
    scores = score_task(clf, data, splits, cfg.batch_size, progress)
    for warning in scores.warnings:
        print(f"evaluate: warning: {warning}")
    results, primary = scores.results, scores.primary
    figures = _task_figures(clf.task, primary, results[primary], *scores.outputs[primary], clf.label_names)

    chain = provenance_chain(clf.checkpoint.get("provenance"), "finetune")
    task_name = scorecard_task((clf.checkpoint.get("task") or {}).get("source") or {})
    what = clf.task.describe(clf.text_columns, clf.label_names)
    main = clf.task.selection
    recorded = (clf.checkpoint.get("metrics") or {}).get(f"validation_{main}")
    facts = {
        **checkpoint_facts(clf, model_path, ckpt_sha, tok_sha),
        "task": f"{what} (max_len {clf.max_len})",
        "recorded": None if recorded is None else f"validation {main} {float(recorded):.4f}",
    }
    report = render_task_report(
        task_type, results, checkpoint=facts, chain=chain, task_name=task_name, figures=figures, notes=scores.notes
    )
    write_evaluation_report(REPORT, report)
    details = details_for_dvc(results)
    write_json(DETAILS, details)
    metrics = summary_for_dvc(task_type, results)
    write_json(METRICS, metrics)
    # The scorecard compares classification accuracy: no row for these task types (yet).
    print(f"evaluate: no scorecard row for a {task_type} run (the scorecard compares classification accuracy)")
    write_run_row(None)
    run.log_metrics(details)
    _finish(run, cfg, model_path, chain)
    summary = ", ".join(clf.task.result_line(role, r) for role, r in results.items())
    print(f"evaluate: {summary} -> {REPORT}")
    return metrics


if __name__ == "__main__":
    run_stage(main)
