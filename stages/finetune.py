"""DVC stage `finetune`: pre-trained encoder + classification task → data/finetune/model.pt.

Reads params ``finetune``; the task data come from the hub, a hub mirror (``finetune.mirror`` or
env ``BERTRACE_HUB_MIRROR``) or local files (``finetune.task``). Writes ``data/finetune/model.pt``
(docs/formats.md "Fine-tuned checkpoint"; the best seed's model) and a copy of the tokenizer next to it,
``metrics/finetune.json`` (mean ± std validation accuracy), ``reports/finetune.json`` (per seed, examples,
truncation …), one nested MLflow run per seed under the stage's run, and ``data/provenance/finetune.json``.
Every output is a function of the code, params and input bytes; CPU and wall times go to the run log
(``runs/<stage>.json`` ``timings``) and MLflow only.

``python -m stages.finetune --variant NAME`` (the DVC stages ``finetune_variant@NAME``) fine-tunes the same
checkpoint with params.yaml ``finetune_variants.NAME`` laid over ``finetune`` (e.g. ``mode: frozen``):
``data/variants/NAME/model.pt``, ``reports/variants/NAME.json`` (no DVC metrics file: the scorecard's
"Fine-tuning variants" table shows them) and ``data/provenance/finetune_variant@NAME.json``.

``finetune.checkpoint`` may also be a published checkpoint (a Hugging Face model directory or hub
pointer file, ``pipeline/interop/hf_import.py``): its converted tokenizer is the one written next to the
model, and its ``imported`` record (source, revision, sha256 of every file read) ends the chain.
"""

from __future__ import annotations

import stages.arithmetic  # noqa: F401  (first: params.yaml compute's CPU kernel pins, set before torch loads)

# isort: split
import argparse
import contextlib
import functools
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pipeline.core.device import apply_arithmetic
from pipeline.core.errors import BertraceError
from pipeline.core.io import atomic_path, sha256_bytes
from pipeline.data.hub import configured_mirror
from pipeline.data.tokenizer import load_tokenizer
from pipeline.finetune.loop import (
    FinetuneConfig,
    finetune,
    finetuned_model_config,
    variant_params,
)
from pipeline.finetune.results import checkpoint_metrics, headline_metrics
from pipeline.finetune.task_data import load_task_data
from pipeline.finetune.tasks.base import TaskType
from pipeline.interop.hf_import import describe, import_checkpoint, is_hf_source, write_tokenizer
from pipeline.lineage.provenance import iter_records
from pipeline.lineage.tracking import source_tags
from pipeline.models.checkpoint import (
    architecture,
    check_checkpoint_tokenizer,
    load_pretrained,
    resolve_checkpoint,
    save_finetuned,
)
from stages.arithmetic import compute_config
from stages.common import StageRun, load_params, run_stage

OUT = Path("data/finetune")
VARIANTS_OUT = Path("data/variants")  # data/variants/<name>/model.pt
VARIANTS_REPORTS = Path("reports/variants")  # reports/variants/<name>.json: what the scorecard's table reads


def pretrain_max_seq_len(ckpt: dict) -> int | None:
    """``examples.max_seq_len`` of the examples the checkpoint was pre-trained on, from the examples
    record its provenance embeds; None without one (a checkpoint imported from Hugging Face)."""
    for stage, record in iter_records(ckpt.get("provenance") or {}, "pretrain"):
        if stage == "examples":
            value = (record.get("params") or {}).get("max_seq_len")
            return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def _stage_params(params: dict, variant: str | None) -> tuple[dict, str, Path, dict]:
    """``(params, stage name, output directory, overrides)``: ``finetune``'s, or those of the
    ``finetune_variants`` entry ``variant`` laid over them."""
    if variant is None:
        return params, "finetune", OUT, {}
    variants = load_params("finetune_variants") or {}
    if variant not in variants:
        raise BertraceError(
            f"params.yaml: finetune_variants has no {variant!r} (it has {sorted(variants)}); "
            "add it, or run `dvc repro` to run the variants dvc.yaml expands from it"
        )
    overrides = variants[variant]
    return variant_params(params, overrides, variant), f"finetune_variant@{variant}", VARIANTS_OUT / variant, overrides


def _check_positions(
    ckpt: dict, ckpt_path: Path, cfg: FinetuneConfig, key: str, warn: Callable[[str], None]
) -> int | None:
    """Refuse a ``max_len`` beyond the model's positions; warn when it is beyond the positions
    pre-training used (``examples.max_seq_len``, returned; None when the checkpoint records none)."""
    max_len = cfg.max_len
    if max_len > int(ckpt["model_config"]["max_position"]):
        raise BertraceError(
            f"params.yaml: finetune.max_len {max_len} exceeds the pre-trained model's "
            f"max_position {ckpt['model_config']['max_position']} ({ckpt_path}); lower it"
        )
    seq_len = pretrain_max_seq_len(ckpt)
    if seq_len is not None and max_len > seq_len and cfg.mode != "scratch":  # scratch: no position is pre-trained
        warn(
            f"params.yaml: {key}.max_len {max_len} exceeds the pre-training examples' max_seq_len "
            f"{seq_len} ({ckpt_path}): positions {seq_len}..{max_len - 1} were never trained; lower "
            f"{key}.max_len to {seq_len} (truncation: head_tail keeps a long text's start and end), or "
            f"pre-train with examples.max_seq_len >= {max_len}"
        )
    return seq_len


def _checkpoint_inputs(
    run: StageRun, ckpt: dict, ckpt_path: Path, tokenizer_path: Path, tokenizer_sha: str, imported: bool
) -> str:
    """Record the checkpoint (and tokenizer) as inputs and its chain as upstream; its sha256."""
    if imported:  # the directory (or pointer file); an inline hf:<id> is no file: its files' hashes
        ckpt_sha = (
            run.add_input(ckpt_path)
            if ckpt_path.exists()
            else run.add_input(ckpt_path, sha256_bytes(repr(ckpt["provenance"]["inputs"]).encode()))
        )
        run.add_upstream("imported", ckpt["provenance"])
        run.set_tags({"bertrace.imported_from": describe(ckpt["provenance"])})
        return ckpt_sha
    ckpt_sha = run.add_input(ckpt_path)
    run.add_input(tokenizer_path, tokenizer_sha)
    if run.add_upstream("pretrain") is None and ckpt.get("provenance"):
        run.add_upstream("pretrain", ckpt["provenance"])
    return ckpt_sha


def _seed_runs(run: StageRun, common_tags: dict[str, str], mode: str):
    """A context manager factory: a nested MLflow run per seed (none when the stage logs no MLflow)."""

    @contextlib.contextmanager
    def seed_run(seed: int):
        if run.mlflow_run_id is None:
            yield None
            return
        import mlflow

        parent = mlflow.active_run()
        with mlflow.start_run(
            run_name=f"finetune-seed-{seed}",
            nested=True,
            experiment_id=parent.info.experiment_id,
            tags={**source_tags(), **common_tags, "bertrace.seed": str(seed), "bertrace.pipeline_run_id": run.run_id},
        ):
            mlflow.log_params({"seed": seed, "mode": mode})
            yield lambda metrics, step: mlflow.log_metrics(
                {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}, step=step
            )

    return seed_run


def _details(summary: dict, data, n_seeds: int, seq_len: int | None, warnings: list[str]) -> dict:
    """reports/finetune.json's numbers (a variant's report adds its name and overrides)."""
    metrics = {
        **headline_metrics(summary),  # classification: validation_accuracy, validation_loss, best_seed, ...
        "per_seed": summary["per_seed"],
        "n_seeds": n_seeds,
        "examples": {role: len(s) for role, s in data.splits.items()},
        "truncated": {role: s.truncated for role, s in data.splits.items()},
        # rows with empty text (no words), skipped in training and in the validation score alike
        "skipped_rows": {role: s.skipped for role, s in data.splits.items()},
        "pretrain_max_seq_len": seq_len,  # None: the checkpoint records none (imported)
        "warnings": warnings,
    }
    metrics.update(data.task.split_details(data.splits))  # NER: bio_violations, multi_tags
    return metrics


def _provenance(run: StageRun, data, tokenizer_sha: str, ckpt: dict, ckpt_path: Path, ckpt_sha: str, mode: str) -> dict:
    """The record the fine-tuned checkpoint embeds: this run's, with the task files and the
    pre-trained checkpoint it started from (docs/formats.md)."""
    return run.checkpoint_provenance(
        without=("outputs", "upstream"),
        task_files=data.files,
        tokenizer_sha256=tokenizer_sha,
        pretrain_checkpoint=ckpt_path.as_posix(),
        pretrain_checkpoint_sha256=ckpt_sha,
        # docs/formats.md: None for scratch (only the architecture came from the checkpoint).
        pretrain=None if mode == "scratch" else ckpt.get("provenance"),
    )


def _save(
    out: Path,
    run: StageRun,
    ckpt: dict,
    data,
    cfg: FinetuneConfig,
    summary: dict,
    best,
    provenance: dict,
    tokenizer_path: Path,
    tokenizer_sha: str,
) -> None:
    """Write the fine-tuned checkpoint (the best seed's weights) and its tokenizer beside it; record both."""
    save_finetuned(
        out / "model.pt",
        state_dict=best.state_dict,
        model_config=finetuned_model_config(ckpt, cfg.pooling, data.task_type),
        label_names=data.label_names,
        task=data.task_info(),
        tokenizer_sha256=tokenizer_sha,
        mode=cfg.mode,
        seed=best.seed,
        metrics=checkpoint_metrics(summary, best, cfg.seeds),
        provenance=provenance,
        num_labels=data.num_labels,
        architecture=architecture(ckpt),
    )
    run.checkpoint_written(provenance)  # what trace finds this run by
    if tokenizer_path != out / "tokenizer.json":
        with atomic_path(out / "tokenizer.json") as tmp:
            shutil.copyfile(tokenizer_path, tmp)
    run.add_output(out / "model.pt")
    run.add_output(out / "tokenizer.json", tokenizer_sha)
    run.set_tags({"bertrace.best_seed": best.seed})


def main(progress: bool = True, variant: str | None = None) -> dict:
    t_cpu = time.process_time()
    params, stage, out, overrides = _stage_params(load_params("finetune"), variant)
    cfg = FinetuneConfig.from_params(params, section=f"finetune_variants.{variant}" if variant else None)
    compute = compute_config()
    apply_arithmetic(compute)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    mirror = configured_mirror(cfg.mirror)
    # A Hugging Face model directory or hub pointer file (pipeline/interop/hf_import.py) brings its own tokenizer:
    # finetune.tokenizer names the same path, so DVC tracks it instead of the tokenizer stage's output.
    imported = is_hf_source(cfg.checkpoint)
    if imported and cfg.tokenizer != cfg.checkpoint:
        raise BertraceError(
            f"params.yaml: finetune.checkpoint {cfg.checkpoint} is a Hugging Face checkpoint, which brings its own "
            f"tokenizer (converted from its vocab.txt / tokenizer.json), but finetune.tokenizer is {cfg.tokenizer}; "
            f"set finetune.tokenizer: {cfg.checkpoint} too"
        )
    ckpt_path = Path(cfg.checkpoint) if imported else resolve_checkpoint(cfg.checkpoint)
    tokenizer_path = out / "tokenizer.json" if imported else Path(cfg.tokenizer)
    warnings: list[str] = []  # each printed as one line and kept in the report

    def warn(message: str) -> None:
        warnings.append(message)
        print(f"{stage}: warning: {message}", file=sys.stderr)

    with StageRun(stage, {**params, "compute": compute.to_dict()}) as run:
        if imported:
            ckpt = import_checkpoint(cfg.checkpoint)
            write_tokenizer(ckpt, tokenizer_path)  # the checkpoint's tokenizer replaces the pipeline's
            print(f"finetune: {describe(ckpt['provenance'])}")
        else:
            ckpt = load_pretrained(ckpt_path)
        tokenizer_sha = check_checkpoint_tokenizer(ckpt, ckpt_path, tokenizer_path)
        key = f"finetune_variants.{variant}" if "max_len" in overrides else "finetune"
        seq_len = _check_positions(ckpt, ckpt_path, cfg, key, warn)
        ckpt_sha = _checkpoint_inputs(run, ckpt, ckpt_path, tokenizer_path, tokenizer_sha, imported)
        data = load_task_data(
            cfg.task,
            load_tokenizer(tokenizer_path),
            max_len=cfg.max_len,
            truncation=cfg.truncation,
            mirror=mirror,
            roles=("train", "validation"),
            progress=progress,
            warn=warn,
        )
        for path, digest in data.files.items():
            run.add_input(path, digest)
        if mirror:
            run.add_fields({"mirror": str(mirror)})
        common_tags = {
            "bertrace.stage": stage,
            "bertrace.mode": cfg.mode,
            "bertrace.pretrain_checkpoint_sha256": ckpt_sha,
            "bertrace.tokenizer_sha256": tokenizer_sha,
        }
        run.set_tags({**common_tags, "bertrace.seeds": ",".join(map(str, cfg.seeds))})
        print(
            f"finetune: {cfg.mode} from {ckpt_path}, train {len(data.splits['train'])} / validation "
            f"{len(data.splits['validation'])} examples, labels {data.label_names}, seeds {cfg.seeds}"
        )
        seed_run = _seed_runs(run, common_tags, cfg.mode)
        summary, best = finetune(ckpt, data, cfg, progress=progress, seed_context=seed_run, source=str(ckpt_path))

        metrics = _details(summary, data, len(cfg.seeds), seq_len, warnings)
        provenance = _provenance(run, data, tokenizer_sha, ckpt, ckpt_path, ckpt_sha, cfg.mode)
        if variant is not None:
            metrics = {"variant": variant, "overrides": overrides, "mode": cfg.mode, **metrics}
        _save(out, run, ckpt, data, cfg, summary, best, provenance, tokenizer_path, tokenizer_sha)
        return _finish(run, summary, best, metrics, data.task, variant, out, len(cfg.seeds), t_cpu)


def _finish(
    run: StageRun,
    summary: dict,
    best,
    metrics: dict,
    task: TaskType,
    variant: str | None,
    out: Path,
    n_seeds: int,
    t_cpu: float,
) -> dict:
    """metrics/finetune.json (or a variant's report), the timings, the record, the console line."""
    # metrics/finetune.json: the selection metric's dev mean ± std over the seeds (classification:
    # dev_acc; token classification: dev_f1, entity level; regression: dev_pearson)
    acc = summary[f"validation_{task.selection}"]
    short = task.short
    if variant is None:
        run.write_metrics({f"dev_{short}": acc["mean"], "dev_std": acc["std"]}, details=metrics)  # all: reports/
    else:  # no metrics file: `dvc exp show` stays 160 columns wide whatever the number of variants
        run.write_details(metrics, VARIANTS_REPORTS / f"{variant}.json")
        run.parent_metrics = {f"dev_{short}": acc["mean"], "dev_std": acc["std"]}
    cpu_minutes, wall_minutes = (time.process_time() - t_cpu) / 60, run.seconds / 60
    run.log_timings(
        {**summary["timings"], "cpu_minutes": round(cpu_minutes, 3), "wall_minutes": round(wall_minutes, 3)}
    )
    run.write_provenance()
    print(
        f"finetune: validation {task.metric_title} {acc['mean']:.4f} ± {acc['std']:.4f} over {n_seeds} seed(s); "
        f"best seed {best.seed} ({best.score:.4f}) -> {out / 'model.pt'} ({wall_minutes:.1f} min, "
        f"{cpu_minutes:.1f} CPU min)"
    )
    return metrics


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m stages.finetune", description=__doc__.splitlines()[0])
    ap.add_argument("--variant", metavar="NAME", help="a key of params.yaml finetune_variants")
    run_stage(functools.partial(main, variant=ap.parse_args().variant))
