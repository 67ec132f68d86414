"""DVC stage `evaluate`: the fine-tuned classifier on the task's held-out splits.

Loads ``data/finetune/model.pt`` (+ its ``tokenizer.json``), re-reads the task data named by
``finetune.task`` (through ``pipeline.task_data``, encoded with the checkpoint's max_len and
truncation) and writes ``metrics/eval.json``, ``plots/confusion.csv`` (DVC confusion plot),
``reports/confusion.png``, ``reports/evaluation.md`` and ``data/provenance/evaluate.json``.
The MLflow run gets the same numbers, the files, and the model as an MLflow pyfunc
(artifact path ``model``: ``mlflow.pyfunc.load_model("runs:/<run id>/model")``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pipeline.errors import BertraceError
from pipeline.evaluate import (EvaluateConfig, evaluate_logits, metrics_for_dvc, plot_confusion, provenance_chain, render_report,
                               write_confusion_csv, write_report)
from pipeline.scorecard import SCORECARD_JSON, run_row, task_name as scorecard_task, write_run_row
from pipeline.device import resolve_device
from pipeline.inference import Classifier
from pipeline.io import read_json, write_json
from pipeline.task_data import evaluate_roles, load_task_data
from stages.common import PROVENANCE_DIR, StageRun, load_params, run_stage

MODEL = Path("data/finetune/model.pt")
METRICS = Path("metrics/eval.json")
CONFUSION_CSV = Path("plots/confusion.csv")
CONFUSION_PNG = Path("reports/confusion.png")
REPORT = Path("reports/evaluation.md")


def _provenance_records() -> dict[str, dict]:
    """The records in data/provenance/ (candidates to complete the checkpoint's chain)."""
    records = {}
    if PROVENANCE_DIR.is_dir():
        for path in sorted(PROVENANCE_DIR.glob("*.json")):
            if path.stem != "evaluate":
                records[path.stem] = read_json(path)
    return records


def _metrics_file(stage: str) -> dict:
    path = Path("metrics") / f"{stage}.json"
    return read_json(path) if path.exists() else {}


def main(progress: bool = True) -> dict:
    t0 = time.perf_counter()
    params = load_params("evaluate")
    cfg = EvaluateConfig.from_params(params)
    finetune_params = load_params("finetune")
    task = finetune_params.get("task")
    mirror = finetune_params.get("mirror") or os.environ.get("BERTRACE_HUB_MIRROR") or None
    model_path = MODEL
    splits, batch_size = evaluate_roles(task, cfg.splits), cfg.batch_size  # auto: the task's own roles
    run_params = {**params, "task": task}

    with StageRun("evaluate", run_params) as run:
        clf = Classifier.load(model_path, device=resolve_device(cfg.device, param="evaluate.device"))
        ckpt_sha = run.add_input(model_path)
        tok_sha = run.add_input(model_path.parent / "tokenizer.json")
        run.add_upstream("finetune")
        run.set_tags({"bertrace.finetune_checkpoint_sha256": ckpt_sha, "bertrace.tokenizer_sha256": tok_sha})
        data = load_task_data(task, clf.tokenizer, max_len=clf.max_len, truncation=clf.truncation, mirror=mirror,
                              roles=splits, progress=progress)
        for path, digest in data.files.items():
            run.add_input(path, digest)
        if data.label_names != clf.label_names:
            raise BertraceError(f"params.yaml: finetune.task.label_names {data.label_names} differ from the labels "
                                f"{clf.label_names} that {model_path} was trained with; evaluate with the task it "
                                "was fine-tuned on (rerun dvc repro finetune)")

        results, notes, predictions = {}, [], {}
        for role in splits:
            split = data.splits[role]
            if split.labels is None:
                notes.append(f"{role} ({split.source}) has no labels: not scored")
                continue
            logits = clf.logits_from_ids(split.input_ids, split.token_type_ids, batch_size=batch_size,
                                         progress=progress)
            labels = split.labels.numpy()
            results[role] = evaluate_logits(logits, labels, clf.label_names)
            predictions[role] = (labels, logits.argmax(axis=1))
            if split.truncated:
                notes.append(f"{role}: {split.truncated} of {len(split)} examples cut to {clf.max_len} tokens "
                             f"({clf.truncation})")
        if not results:
            raise BertraceError(f"params.yaml: none of evaluate.splits {splits} has labels; add a labelled split")

        recorded = (clf.checkpoint.get("metrics") or {}).get("validation_accuracy")
        if recorded is not None and "validation" in results:
            diff = abs(results["validation"]["accuracy"] - float(recorded))
            notes.append(f"re-evaluated validation accuracy {results['validation']['accuracy']:.4f} vs "
                         f"{float(recorded):.4f} recorded by fine-tuning"
                         + (" (equal)" if diff < 1e-9 else f" (differs by {diff:.4f}: a different split or data?)"))

        primary = next(iter(results))
        labels, preds = predictions[primary]
        write_confusion_csv(CONFUSION_CSV, labels, preds, clf.label_names)
        plot_confusion(CONFUSION_PNG, results[primary]["confusion_matrix"], clf.label_names,
                       title=f"{primary}: accuracy {results[primary]['accuracy']:.1%} (n={results[primary]['n']})")

        chain = provenance_chain(clf.checkpoint.get("provenance"), "finetune", _provenance_records())
        t = clf.checkpoint.get("task") or {}
        source = t.get("source") or {}
        task_name = scorecard_task(source)  # the scorecard compares the run with its own task's goal only
        arch = clf.model.config
        facts = {
            "path": model_path.as_posix(), "sha256": ckpt_sha, "tokenizer_sha256": tok_sha,
            "mode": clf.checkpoint.get("mode"), "seed": clf.checkpoint.get("seed"),
            "num_parameters": f"{sum(p.numel() for p in clf.model.parameters()):,}",
            "model": f"{arch.num_layers} layers, hidden {arch.hidden_size}, {arch.num_heads} heads, vocab {arch.vocab_size}",
            "task": f"{' + '.join(clf.text_columns)} → {', '.join(clf.label_names)} (max_len {clf.max_len}, "
                    f"{clf.truncation} truncation)",
            "recorded_validation_accuracy": recorded,
        }
        report = render_report(results, checkpoint=facts, chain=chain,
                               task_name=task_name, figure=CONFUSION_PNG.name, notes=notes)
        write_report(REPORT, report)

        metrics = metrics_for_dvc(results)
        write_json(METRICS, metrics)

        # This run's scorecard row; the `scorecard` stage draws it beside recorded profiles and references.
        try:
            row = run_row(cfg.run_name, records=_provenance_records(),
                          finetune_metrics=_metrics_file("finetune"), eval_metrics=metrics,
                          pretrain_metrics=_metrics_file("pretrain"), model_config=clf.checkpoint.get("model_config"),
                          task=task_name, extra_minutes=(time.perf_counter() - t0) / 60.0)
        except BertraceError as why:  # e.g. a checkpoint evaluated outside a full pipeline run
            print(f"evaluate: no scorecard row for this run: {why}")
            row = None
        write_run_row(row)
        run.log_metrics(metrics)  # per-class names are label names: StageRun makes them valid MLflow keys
        for path in (CONFUSION_CSV, CONFUSION_PNG, REPORT, SCORECARD_JSON):
            run.add_output(path)
            run.log_artifact(path, "evaluation")
        if cfg.log_model and run.mlflow_run_id is not None:
            from pipeline.pyfunc import log_pyfunc

            info = log_pyfunc(model_path, "model", registered_model_name=cfg.registered_model_name or None)
            run.set_tags({"bertrace.pyfunc_model_uri": info.model_uri})
        run.extra["chain"] = [e["stage"] for e in chain]
        run.write_provenance()
        summary = ", ".join(f"{role} accuracy {m['accuracy']:.4f} (macro F1 {m['macro_f1']:.4f}, n={m['n']})"
                            for role, m in results.items())
        print(f"evaluate: {summary} -> {REPORT}")
        return metrics


if __name__ == "__main__":
    run_stage(main)
