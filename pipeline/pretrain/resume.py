"""Exact resume: whether ``last.pt`` can be continued with the current data and params, and the state
every rank continues from.

A checkpoint holds the model, optimizer and scaler states, every rank's RNG states and the data
position ``(epoch, batches consumed)``; the loader replays its shuffle from that position, so an
interrupted run continues bit-for-bit like an uninterrupted one (same device, precision and world
size). Only the budget (``resume: true``), cadence and hardware keys (:data:`RESUMABLE_CHANGES`)
may change on resume: any other change would mix two recipes in one checkpoint."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeline.core.errors import BertraceError
from pipeline.models import checkpoint as ckpt_lib
from pipeline.pretrain.config import BUDGETS, PretrainConfig
from pipeline.pretrain.objectives.registry import OBJECTIVES
from pipeline.pretrain.wordvec import EmbeddingInit

# Keys a resumed run may change: the budget (to extend the schedule; resume: true only), cadence and hardware.
# Any other change would silently mix two recipes in one checkpoint.
RESUMABLE_CHANGES = (
    "max_steps",
    "epochs",
    "time_minutes",
    "eval_every",
    "eval_batches",
    "log_every",
    "checkpoint_every",
    "checkpoint_minutes",
    "snapshot_minutes",
    "snapshot_steps",
    "device",
    "precision",
    "tf32",
    "compile",
    "num_threads",
    "deterministic",
    "verify_shards",
    "resume",
)


def budget_of(train_config: dict) -> dict[str, Any]:
    """The budget keys of a checkpoint's ``train_config`` (or of ``PretrainConfig.to_dict()``)."""
    return {k: train_config.get(k) for k in BUDGETS}


def extended_budgets(state: dict, cfg: PretrainConfig) -> list[dict]:
    """The earlier budgets behind a resumed ``state``'s weights: the ones its own run extended,
    plus its budget when it differs from ``cfg``'s (the schedule then stretches from its step)."""
    earlier = list(((state.get("provenance") or {}).get("budget") or {}).get("extends") or [])
    old = budget_of(state.get("train_config") or {})
    if old != budget_of(cfg.to_dict()):
        earlier.append({**{k: v for k, v in old.items() if v is not None}, "at_step": state["step"]})
    return earlier


LEGACY_VALUES = {
    "objective": "mlm_nsp",
    "embedding_init": EmbeddingInit(method="random").to_dict(),
    "mlm_nsp": {"nsp_weight": 1.0},
}


def check_resumable(
    state: dict,
    last_path: Path,
    cfg: PretrainConfig,
    config,
    out_dir: Path,
    *,
    tokenizer_sha: str,
    manifest_sha: str,
    manifest_path: Path,
) -> None:
    """Raise BertraceError when ``state`` cannot be continued with the current data and params."""
    ckpt_lib.check_data_matches(
        state, last_path, tokenizer_sha256=tokenizer_sha, manifest_sha256=manifest_sha, manifest_path=manifest_path
    )
    if state["model_config"] != config.to_dict():
        diff = {
            k: (state["model_config"].get(k), v)
            for k, v in config.to_dict().items()
            if state["model_config"].get(k) != v
        }
        raise BertraceError(
            f"{last_path}: model config differs from params.yaml pretrain.model (checkpoint, now): {diff}; "
            f"delete {out_dir} to start over, or restore the params the checkpoint was trained with"
        )
    old, new = dict(state.get("train_config") or {}), cfg.to_dict()
    if old.get("objective") == "bert":  # named so before mlm_nsp / mlm; nsp_weight 0 was MLM only
        old["objective"] = "mlm" if old.pop("nsp_weight", 1.0) == 0 else "mlm_nsp"
    # for keys added since the checkpoint was written: the value they had before they existed (the
    # recipe was then BERT's from a random embedding), else today's default
    defaults = {**PretrainConfig().to_dict(), **LEGACY_VALUES}
    # an objective's own section (mlm_nsp, electra) matters only when that objective is trained
    unused = {k for k in OBJECTIVES if k in new and k != new["objective"]}
    changed = {
        k: (old.get(k, defaults.get(k)), new[k])
        for k in new
        if k not in RESUMABLE_CHANGES and k != "model" and k not in unused and old.get(k, defaults.get(k)) != new[k]
    }
    if changed:
        raise BertraceError(
            f"{last_path}: was trained with other pretrain params (checkpoint, now): {changed}; only the "
            f"budget, cadence and device settings may change on resume. Delete {out_dir} to start over "
            "with the new params, or restore the old ones"
        )


def resume_state(
    resume: bool | str,
    last_path: Path,
    cfg: PretrainConfig,
    config,
    out_dir: Path,
    device: torch.device,
    rank: int,
    world: int,
    **data_hashes,
) -> dict | None:
    """The ``last.pt`` state to continue, or None to start over: rank 0 decides and every rank
    gets its decision and its state.

    Only rank 0 writes ``last.pt``, so on nodes without a shared filesystem the other ranks have
    no copy, or a stale one: had each rank looked on its own disk, rank 0 would resume while the
    others started from step 0, their loops would differ in length and the collectives would
    hang until the NCCL timeout. So rank 0 reads and checks its file and broadcasts the verdict
    (an error is raised on every rank) and the file's bytes, which every rank loads
    ``weights_only``."""
    main = rank == 0
    state, error, payload = None, None, b""
    if main and resume and last_path.exists():
        try:
            state = ckpt_lib.load_checkpoint(last_path)
            check_resumable(state, last_path, cfg, config, out_dir, **data_hashes)
            old = budget_of(state.get("train_config") or {})
            if resume == "auto" and old != budget_of(cfg.to_dict()):
                # A new budget is a new schedule: continuing the old run would give weights that a
                # fresh `dvc repro` of these params (no last.pt) never makes. Extending is opt-in.
                changed = {k: (v, getattr(cfg, k)) for k, v in old.items() if v != getattr(cfg, k)}
                raise BertraceError(
                    f"{last_path}: trained with another budget (checkpoint, now): {changed}; "
                    "resume: auto starts a run with a new budget over, so that its weights are "
                    "these params' (pretrain.resume: true extends the old run instead, and "
                    "the checkpoint says so)"
                )
        except BertraceError as why:
            if resume != "auto" or state is None:
                error = str(why)
            else:
                # `dvc repro` after a change upstream or in the recipe: a new run, not a resume.
                # The previous checkpoint stays in DVC's cache (it was committed when its run ended).
                print(f"pretrain: not resuming, starting over: {why}", flush=True)
            state = None
        if state is not None and world > 1:
            payload = last_path.read_bytes()
    if world > 1:
        on = device if dist.get_backend() == "nccl" else torch.device("cpu")
        box = [{"error": error, "nbytes": len(payload)}]
        dist.broadcast_object_list(box, src=0, device=on)
        error, nbytes = box[0]["error"], box[0]["nbytes"]
        if error is None and nbytes:
            buf = (
                torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(on)
                if main
                else torch.empty(nbytes, dtype=torch.uint8, device=on)
            )
            dist.broadcast(buf, src=0)
            if not main:
                state = torch.load(io.BytesIO(buf.cpu().numpy().tobytes()), map_location="cpu", weights_only=True)
            del buf
    if error is not None:
        raise BertraceError(error)
    return state
