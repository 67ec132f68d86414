"""DVC stage `pretrain`: BERT MLM + NSP pre-training on data/examples → data/pretrain/{last,best}.pt.

One process: ``python -m stages.pretrain``. Several (DDP): ``torchrun --nproc_per_node N -m
stages.pretrain`` (NCCL on GPUs, gloo on CPU); only rank 0 writes files and logs to MLflow.

It trains in ``runs/resume/pretrain/`` (untracked, git-ignored: DVC deletes ``data/pretrain`` before
every run of the stage) and, when training returns, publishes that directory's checkpoints to
``data/pretrain/`` (``pipeline.pretrain.checkpoint.publish_dir``). A run continues from
``runs/resume/pretrain/last.pt`` when it exists and fits the current data and recipe, so an
interrupted ``dvc repro`` resumes; see ``pretrain.resume``. The outputs hold no times: durations and
throughput go to the run log (``runs/pretrain.json`` ``timings``, MLflow), ``reports/pretrain.json``
holds the rest.

Before training it checks that ``data/tokenizer/tokenizer.json`` (when present) is the tokenizer
the manifest names, and rehashes every shard against the manifest's sha256s (skip with
``pretrain.verify_shards: false`` for huge corpora; the record says ``shards_verified``).
"""

from __future__ import annotations

import stages.arithmetic  # noqa: F401  (first: params.yaml compute's CPU kernel pins, set before torch loads)

# isort: split
import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist

from pipeline.core.device import apply_arithmetic
from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file, write_json
from pipeline.interop.hf_import import describe, import_checkpoint, is_hf_source
from pipeline.lineage.provenance import code_hashes
from pipeline.models.checkpoint import load_checkpoint
from pipeline.pretrain.checkpoint import forget_other_code, publish_dir
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.data import load_manifest, verify_shards
from pipeline.pretrain.loop import pretrain
from pipeline.pretrain.metrics import TRAIN_CURVE, VAL_CURVE, split_timings
from stages.arithmetic import compute_config
from stages.common import DETAILS_DIR, METRICS_DIR, StageRun, load_params, run_stage

EXAMPLES = Path("data/examples")
TOKENIZER = Path("data/tokenizer/tokenizer.json")
OUT = Path("data/pretrain")
WORK = Path("runs/resume/pretrain")  # where training writes and resumes; published to OUT when it returns
PLOTS = Path("plots")


def _init_distributed(cfg: PretrainConfig) -> tuple[int, int]:
    """Join the process group torchrun describes in RANK / WORLD_SIZE / LOCAL_RANK."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and not cfg.device.startswith(("cpu", "mps"))
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        gpus = torch.cuda.device_count()
        torch.cuda.set_device(local_rank % gpus)  # the GPU pipeline.core.device.resolve_device gives this rank
        if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > gpus:  # NCCL refuses two ranks on one GPU
            backend = "gloo"
            if rank == 0:
                print(
                    f"pretrain: {os.environ['LOCAL_WORLD_SIZE']} processes share {gpus} GPU(s): gloo instead of "
                    "NCCL (a test setup; for speed run one process per GPU)",
                    flush=True,
                )
    dist.init_process_group(backend)
    return rank, world


def check_examples_tokenizer(manifest: dict, tokenizer: Path = TOKENIZER, examples: Path = EXAMPLES) -> None:
    """The tokenizer on disk is the one the shards were made with (the manifest's ``tokenizer_sha256``).

    A checkpoint is checked against the manifest's copy of that hash on resume; this ties the
    file itself in, so a retrained tokenizer with stale shards is caught before training."""
    if not tokenizer.is_file():
        return
    now = sha256_file(tokenizer)
    if now != manifest["tokenizer_sha256"]:
        raise BertraceError(
            f"{tokenizer}: sha256 {now}, but {examples / 'manifest.json'} was made with tokenizer "
            f"{manifest['tokenizer_sha256']}; the tokenizer changed after the examples stage, rerun it "
            "(dvc repro examples)"
        )


def check_shards(cfg: PretrainConfig, manifest: dict, rank: int, world: int, examples: Path = EXAMPLES) -> bool:
    """Rehash the shards against the manifest unless ``pretrain.verify_shards`` is false; returns
    whether they were verified. Rank 0 hashes; every rank raises the same error."""
    if not getattr(cfg, "verify_shards", True):
        if rank == 0:
            print(
                f"pretrain: pretrain.verify_shards is false: the shards in {examples} are not checked "
                "against their manifest (recorded as shards_verified: false)"
            )
        return False
    error = None
    if rank == 0:
        try:
            verify_shards(examples, manifest, progress=True)
        except BertraceError as e:
            error = str(e)
    if world > 1:
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error:
        raise BertraceError(error)
    return True


def import_published(source: str) -> tuple[dict, dict] | None:
    """``pretrain.init`` as a published model (a Hugging Face model directory or hub pointer file,
    pipeline/interop/hf_import.py): the converted checkpoint and its record; None for our own ``.pt``."""
    if not is_hf_source(source):
        return None
    init = import_checkpoint(source, param="pretrain.init")
    return init, {"path": str(source), "imported_from": describe(init["provenance"])}


def record_inputs(run: StageRun, cfg: PretrainConfig, rank: int, world: int) -> None:
    """Check the examples (manifest, tokenizer, shards) and record them in the run and its tags."""
    manifest = load_manifest(EXAMPLES)  # a clear error when the examples stage has not run
    manifest_sha = run.add_input(EXAMPLES / "manifest.json")
    run.add_upstream("examples")
    check_examples_tokenizer(manifest)
    verified = check_shards(cfg, manifest, rank, world)
    run.add_fields(
        {
            "tokenizer_sha256": manifest["tokenizer_sha256"],
            "examples_manifest_sha256": manifest_sha,
            "world_size": world,
            "shards_verified": verified,
            "objective": cfg.objective,
        }
    )
    run.set_tags(
        {
            "bertrace.objective": cfg.objective,
            "bertrace.tokenizer_sha256": manifest["tokenizer_sha256"],
            "bertrace.examples_manifest_sha256": manifest_sha,
            "bertrace.world_size": world,
            "bertrace.shards_verified": verified,
        }
    )


def publish(run: StageRun, metrics: dict, timings: dict) -> None:
    """Rank 0, after training: the checkpoints to data/pretrain, the metrics files, MLflow and the run log."""
    publish_dir(WORK, OUT)
    for name in ("last.pt", "best.pt"):
        if (OUT / name).exists():
            run.add_output(OUT / name)
    run.checkpoint_written(load_checkpoint(OUT / "last.pt")["provenance"])  # what trace finds the run by
    run.set_tags({"bertrace.model_sha256": metrics["model_sha256"]})
    run.add_fields({k: metrics[k] for k in ("budget", "deterministic", "num_threads") if k in metrics})
    write_json(DETAILS_DIR / "pretrain.json", metrics)  # every number but the timings
    run.log_timings(timings)  # the run log and MLflow: they differ on every rebuild
    write_json(METRICS_DIR / "pretrain.json", metrics_summary(metrics))  # the DVC metrics file: the few compared
    run.log_metrics({"final": metrics}, step=metrics["step"])  # final.* (per-step curves stay clean)
    run.log_artifact(PLOTS / TRAIN_CURVE, "plots")
    run.log_artifact(PLOTS / VAL_CURVE, "plots")
    run.log_artifact(OUT / "last.pt", "checkpoint")
    run.write_provenance()


def summary_line(metrics: dict, timings: dict) -> str:
    """What the stage prints when it is done: steps, tokens, minutes and the objective's validation loss."""
    val = (
        f", val MLM loss {metrics['val_mlm_loss']:.4f} (ppl {metrics['val_perplexity']:.1f})"
        if "val_mlm_loss" in metrics
        else ""
    )
    if "val_disc_loss" in metrics:  # electra
        val = (
            f", val discriminator loss {metrics['val_disc_loss']:.4f} (acc {metrics['val_disc_acc']:.3f}), "
            f"generator MLM loss {metrics['val_gen_loss']:.4f}"
        )
    if "val_bits_per_byte" in metrics:  # clm
        val = (
            f", val loss {metrics['val_loss']:.4f} (ppl {metrics['val_perplexity']:.1f}, "
            f"{metrics['val_bits_per_byte']:.3f} bits/byte; unigram {metrics['val_unigram_loss']:.4f})"
        )
    return (
        f"pretrain: step {metrics['step']}, {metrics['tokens_seen']:,} tokens, "
        f"{timings['train_seconds'] / 60:.1f} min{val} -> {OUT}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.pretrain", description=__doc__.splitlines()[0])
    parser.add_argument("--no-resume", action="store_true", help=f"ignore {WORK}/last.pt and start over")
    args = parser.parse_args(argv)

    params = load_params("pretrain")
    # resume: auto (default) continues runs/resume/pretrain/last.pt when it was trained on the same data,
    # recipe, budget and code of this stage (only cadence/device changed) and starts over otherwise; true insists on
    # resuming (a mismatch is an error naming both hashes; a larger budget extends the run);
    # false (or --no-resume) starts over.
    cfg = PretrainConfig.from_params(params)
    compute = compute_config()
    apply_arithmetic(compute)
    resume = False if args.no_resume else cfg.resume
    rank, world = _init_distributed(cfg)
    main_rank = rank == 0
    try:
        with StageRun(
            "pretrain", {**params, "compute": compute.to_dict()}, log_mlflow=main_rank, system_metrics=True
        ) as run:
            record_inputs(run, cfg, rank, world)
            if main_rank and (note := forget_other_code(WORK, code_hashes("pretrain"), resume)):
                print(f"pretrain: {note}")
            metrics, timings = split_timings(
                pretrain(
                    cfg,
                    examples_dir=EXAMPLES,
                    out_dir=WORK,
                    provenance=run.checkpoint_provenance(),
                    resume=resume,
                    on_log=lambda step, m: run.log_metrics(m, step=step),
                    progress=main_rank,
                    tokenizer_json=TOKENIZER if TOKENIZER.exists() else None,
                    curves_dir=PLOTS,
                    import_init=import_published,
                )
            )
            if not main_rank:
                return
            publish(run, metrics, timings)
            print(summary_line(metrics, timings))
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def metrics_summary(metrics: dict) -> dict:
    """The numbers ``metrics/pretrain.json`` holds (``dvc exp show`` columns): tokens seen, validation
    loss and each objective's validation accuracy (``val_mlm_acc`` → ``mlm_acc``); no timings."""
    out = {"tokens": metrics.get("tokens_seen"), "val_loss": metrics.get("val_loss")}
    out.update(
        {
            k[len("val_") :]: v
            for k, v in sorted(metrics.items())
            if k.startswith("val_") and k.endswith("_acc") and v is not None
        }
    )
    for k in ("val_bits_per_byte", "val_unigram_bits_per_byte"):  # clm: comparable across tokenizers
        out[k[len("val_") :]] = metrics.get(k)
    return {k: v for k, v in out.items() if v is not None}


if __name__ == "__main__":
    run_stage(main)
