"""DVC stage `finetune`: pre-trained encoder + classification task → data/finetune/model.pt.

Reads params ``finetune``; the task data come from the hub, a hub mirror (``finetune.mirror`` or
env ``BERTRACE_HUB_MIRROR``) or local files (``finetune.task``). Writes ``data/finetune/model.pt``
(SPEC "Fine-tuned checkpoint"; the best seed's model) and a copy of the tokenizer next to it,
``metrics/finetune.json`` (per seed and mean ± std validation accuracy, CPU minutes), one nested
MLflow run per seed under the stage's run, and ``data/provenance/finetune.json``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

import torch

from pipeline.errors import BertraceError
from pipeline.finetune import (FinetuneConfig, check_tokenizer, finetune, load_pretrained, resolve_checkpoint,
                               save_finetuned)
from pipeline.io import atomic_path
from pipeline.task_data import load_task_data
from pipeline.tokenizer import load_tokenizer
from stages.common import StageRun, load_params, run_stage

OUT = Path("data/finetune")


def main(progress: bool = True) -> dict:
    t_cpu = time.process_time()
    params = load_params("finetune")
    cfg = FinetuneConfig.from_params(params)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    mirror = cfg.mirror or os.environ.get("BERTRACE_HUB_MIRROR") or None
    max_len, truncation = cfg.max_len, cfg.truncation
    ckpt_path = resolve_checkpoint(cfg.checkpoint)
    tokenizer_path = Path(cfg.tokenizer)

    with StageRun("finetune", params) as run:
        ckpt = load_pretrained(ckpt_path)
        tokenizer_sha = check_tokenizer(ckpt, ckpt_path, tokenizer_path)
        if max_len > int(ckpt["model_config"]["max_position"]):
            raise BertraceError(f"params.yaml: finetune.max_len {max_len} exceeds the pre-trained model's "
                                f"max_position {ckpt['model_config']['max_position']} ({ckpt_path}); lower it")
        ckpt_sha = run.add_input(ckpt_path)
        run.add_input(tokenizer_path, tokenizer_sha)
        if run.add_upstream("pretrain") is None and ckpt.get("provenance"):
            run.upstream["pretrain"] = ckpt["provenance"]
        data = load_task_data(cfg.task, load_tokenizer(tokenizer_path), max_len=max_len,
                              truncation=truncation, mirror=mirror, roles=("train", "validation"), progress=progress)
        for path, digest in data.files.items():
            run.add_input(path, digest)
        if mirror:
            run.extra["mirror"] = str(mirror)
        common_tags = {"bertrace.stage": "finetune", "bertrace.mode": cfg.mode,
                       "bertrace.pretrain_checkpoint_sha256": ckpt_sha, "bertrace.tokenizer_sha256": tokenizer_sha}
        run.set_tags({**common_tags, "bertrace.seeds": ",".join(map(str, cfg.seeds))})
        print(f"finetune: {cfg.mode} from {ckpt_path}, train {len(data.splits['train'])} / validation "
              f"{len(data.splits['validation'])} examples, labels {data.label_names}, seeds {cfg.seeds}")

        @contextlib.contextmanager
        def seed_run(seed: int):
            """A nested MLflow run per seed (none when the stage logs no MLflow)."""
            if run.mlflow_run_id is None:
                yield None
                return
            import mlflow

            parent = mlflow.active_run()
            with mlflow.start_run(run_name=f"finetune-seed-{seed}", nested=True,
                                  experiment_id=parent.info.experiment_id,
                                  tags={**common_tags, "bertrace.seed": str(seed),
                                        "bertrace.pipeline_run_id": run.run_id}):
                mlflow.log_params({"seed": seed, "mode": cfg.mode})
                yield lambda metrics, step: mlflow.log_metrics(
                    {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

        summary, best = finetune(ckpt, data, cfg, progress=progress, seed_context=seed_run, source=str(ckpt_path))

        metrics = {
            "validation_accuracy": summary["validation_accuracy"],
            "validation_loss": summary["validation_loss"],
            "best_seed": summary["best_seed"],
            "best_validation_accuracy": summary["best_validation_accuracy"],
            "per_seed": summary["per_seed"],
            "n_seeds": len(cfg.seeds),
            "examples": {role: len(s) for role, s in data.splits.items()},
            "truncated": {role: s.truncated for role, s in data.splits.items()},
            "cpu_minutes": round((time.process_time() - t_cpu) / 60, 3),
            "wall_minutes": round(run.seconds / 60, 3),
        }
        record = run.provenance()
        provenance = {k: v for k, v in record.items() if k not in ("outputs", "upstream")}
        provenance.update({
            "task_files": data.files,
            "tokenizer_sha256": tokenizer_sha,
            "pretrain_checkpoint": ckpt_path.as_posix(),
            "pretrain_checkpoint_sha256": ckpt_sha,
            # SPEC: None for scratch (only the architecture came from the checkpoint).
            "pretrain": None if cfg.mode == "scratch" else ckpt.get("provenance"),
        })
        save_finetuned(
            OUT / "model.pt", state_dict=best.state_dict, model_config=ckpt["model_config"],
            label_names=data.label_names, task=data.task_info(), tokenizer_sha256=tokenizer_sha, mode=cfg.mode,
            seed=best.seed,
            metrics={"validation_accuracy": best.validation_accuracy, "validation_loss": best.validation_loss,
                     "validation_accuracy_mean": summary["validation_accuracy"]["mean"],
                     "validation_accuracy_std": summary["validation_accuracy"]["std"], "seeds": cfg.seeds},
            provenance=provenance,
        )
        with atomic_path(OUT / "tokenizer.json") as tmp:
            shutil.copyfile(tokenizer_path, tmp)
        run.add_output(OUT / "model.pt")
        run.add_output(OUT / "tokenizer.json", tokenizer_sha)
        run.set_tags({"bertrace.best_seed": best.seed})
        run.write_metrics(metrics)
        run.write_provenance()
        acc = summary["validation_accuracy"]
        print(f"finetune: validation accuracy {acc['mean']:.4f} ± {acc['std']:.4f} over {len(cfg.seeds)} seed(s); "
              f"best seed {best.seed} ({best.validation_accuracy:.4f}) -> {OUT / 'model.pt'}")
        return metrics


if __name__ == "__main__":
    run_stage(main)
