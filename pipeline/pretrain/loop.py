"""Pre-training, wired together: :func:`pretrain` loads the data, builds (or resumes) the model and runs
a :class:`~pipeline.pretrain.trainer.Trainer` until the budget is spent.

*What* is learnt is an objective (``pipeline/pretrain/objectives/``: BERT's MLM + NSP by default);
*how*: the params (:mod:`~pipeline.pretrain.config`), the learning-rate schedule and budget
(:mod:`~pipeline.pretrain.schedule`), the updates, checkpoints and logging
(:mod:`~pipeline.pretrain.trainer`), exact resume (:mod:`~pipeline.pretrain.resume`), DDP
(:mod:`~pipeline.pretrain.distributed`), and the validation metrics and curves
(:mod:`~pipeline.pretrain.metrics`).

Budgets: ``max_steps`` (the default) or ``epochs`` are counts of updates, so the same commit and
params give the same weights on any machine of the same kind (see ``pipeline/core/device.py`` for
what "same kind" means). ``time_minutes`` is wall clock, as in cramming (Geiping & Goldstein
2022, section 3): progress is ``elapsed / budget``, so the weights depend on the machine's speed
and load; a checkpoint trained so records ``budget.deterministic: false`` and ``bertrace trace``
says so.

Exact resume is tested on the CPU. On CUDA it also needs ``pretrain.deterministic: true``
(pipeline/core/device.py): otherwise the backward of the MLM gather (``index_select``) and of
memory-efficient attention accumulate with atomics in no fixed order and a resumed run drifts from
an uninterrupted one in the last bits. Under DDP only rank 0 reads ``last.pt`` and it broadcasts
the state, so nodes need no shared filesystem.

:func:`pretrain` returns the final metrics and the session's timings (:data:`~pipeline.pretrain.metrics.TIMINGS`:
``train_seconds``, ``tokens_per_s``, ``steps_per_s``, ``mfu``, ``embedding_init_seconds``), which
:func:`~pipeline.pretrain.metrics.split_timings` parts for the stage's run log. A run the wall clock
governs (``time_minutes``, ``snapshot_minutes``, ``checkpoint_minutes``) keeps ``train_seconds`` in
its checkpoints: its resume needs it.

``pretrain.init`` starts from trained weights: our checkpoint, or a published one that the caller
imports (``import_init``; stages/pretrain.py passes the Hugging Face import of pipeline/interop/).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from pipeline.core.device import (
    arithmetic_state,
    precision_name,
    resolve_device,
    resolve_precision,
    restore_deterministic,
    set_deterministic,
)
from pipeline.core.errors import BertraceError
from pipeline.core.io import canonical_json, sha256_file
from pipeline.models import checkpoint as ckpt_lib
from pipeline.models.bert import BertConfig, ModelParams, config_from_params
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.data import PretrainingData, continuation_table, load_manifest
from pipeline.pretrain.distributed import rank_and_world
from pipeline.pretrain.metrics import TRAIN_CURVE, VAL_CURVE
from pipeline.pretrain.objectives.base import Objective
from pipeline.pretrain.objectives.registry import make_objective
from pipeline.pretrain.resume import extended_budgets, resume_state
from pipeline.pretrain.schedule import Budget, budget_steps
from pipeline.pretrain.trainer import Trainer
from pipeline.pretrain.wordvec import EmbeddingInit, initialise_embedding

# ``import_init(source)``: a published checkpoint's ``(checkpoint, record)``, or None when ``source`` is ours.
ImportInit = Callable[[str], "tuple[dict, dict] | None"]


def pretrain(
    cfg: PretrainConfig,
    *,
    examples_dir: Path,
    out_dir: Path,
    provenance: dict,
    resume: bool | str = True,
    on_log: Callable[[int, dict], None] | None = None,
    progress: bool = True,
    tokenizer_json: Path | None = None,
    curves_dir: Path | None = None,
    stop_at_step: int | None = None,
    import_init: ImportInit | None = None,
) -> dict:
    """Pre-train on ``examples_dir`` with ``cfg.objective``; checkpoints ``out_dir/{last,best}.pt``.

    ``provenance`` (the stage's record: params, inputs, ...) is stored in every checkpoint, completed with the
    tokenizer and examples-manifest hashes, torch version, device, thread count, determinism
    and budget. ``resume`` continues from ``out_dir/last.pt`` when present (after checking it
    was trained on the same data and model config; ``resume="auto"`` starts over instead of
    failing when they differ, and when the budget differs: only ``resume=True`` extends a run). ``on_log(step, metrics)`` receives training metrics every
    ``log_every`` updates and validation metrics (``val_*``) after each evaluation.
    ``tokenizer_json`` is needed only for dynamic whole-word masking. Loss curves go to
    ``curves_dir`` (default ``out_dir``). ``stop_at_step`` ends the run early (after
    checkpointing) without changing the schedule, e.g. to train in chunks. ``import_init(cfg.init)``
    converts a published ``pretrain.init`` (returns ``(checkpoint, record)``, or None for our own
    ``.pt``); without it ``pretrain.init`` must be our checkpoint. Multi-process (DDP)
    when ``torch.distributed`` is initialised; only rank 0 writes files or calls ``on_log``.
    Returns the final metrics and this session's timings in one dict
    (:func:`~pipeline.pretrain.metrics.split_timings` parts them).
    """
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    if cfg.num_threads:
        torch.set_num_threads(int(cfg.num_threads))
    try:
        return _pretrain(
            cfg,
            examples_dir=Path(examples_dir),
            out_dir=Path(out_dir),
            provenance=provenance,
            resume=resume,
            on_log=on_log,
            progress=progress,
            tokenizer_json=tokenizer_json,
            curves_dir=Path(curves_dir) if curves_dir else Path(out_dir),
            stop_at_step=stop_at_step,
            import_init=import_init,
        )
    finally:  # process-wide settings: leave them as found
        torch.set_num_threads(threads)
        restore_deterministic(det)


class _Runtime(NamedTuple):
    device: torch.device
    determinism: Any
    autocast_dtype: torch.dtype | None
    use_scaler: bool
    precision: str


def _runtime(device_name: str, precision: str, *, deterministic: bool, tf32: bool) -> _Runtime:
    """Device, deterministic kernels (set before the first CUDA kernel), AMP dtype and TF32."""
    device = resolve_device(device_name)
    determinism = set_deterministic(deterministic, device)  # before the first CUDA kernel
    autocast_dtype, use_scaler = resolve_precision(precision, device)
    if device.type == "cuda":  # TF32 matmuls on Ampere+ (a process-wide setting)
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
    return _Runtime(device, determinism, autocast_dtype, use_scaler, precision_name(autocast_dtype))


def _our_checkpoint(source: str) -> tuple[dict, dict]:
    """``pretrain.init`` as one of our pre-training checkpoints: the checkpoint and its record."""
    path = Path(source)
    if not path.is_file():
        raise BertraceError(
            f"params.yaml: pretrain.init {path}: not found; give a checkpoint (.pt) or a Hugging "
            "Face model directory / hub pointer file, or null for a random init"
        )
    init = ckpt_lib.load_checkpoint(path)
    if "model" not in init or "model_config" not in init:
        raise BertraceError(f"params.yaml: pretrain.init {path}: not a pre-training checkpoint (no model weights)")
    return init, {"path": path.as_posix(), "sha256": sha256_file(path), "step": init.get("step")}


def _init_checkpoint(
    source: str, tokenizer_sha: str, tokenizer_json: Path | None, import_init: ImportInit | None
) -> dict[str, Any]:
    """``{model, model_config, provenance, record}`` of ``pretrain.init``: a published checkpoint
    (``import_init``) or ours, checked to share the examples' vocabulary (same ids, same tokens)."""
    imported = import_init(source) if import_init is not None else None
    init, record = imported if imported is not None else _our_checkpoint(source)
    init_sha = (init.get("provenance") or {}).get("tokenizer_sha256")
    if init_sha != tokenizer_sha:
        same_vocab = False
        if tokenizer_json is not None and "tokenizer_json" in init:
            from tokenizers import Tokenizer

            same_vocab = (
                Tokenizer.from_file(str(tokenizer_json)).get_vocab()
                == Tokenizer.from_str(init["tokenizer_json"]).get_vocab()
            )
        if not same_vocab:
            raise BertraceError(
                f"params.yaml: pretrain.init {source} was trained with another tokenizer (sha256 {init_sha}) than "
                f"the examples (sha256 {tokenizer_sha}): its token ids would mean other tokens. Continue pre-training "
                "on examples made with the checkpoint's own tokenizer, or set pretrain.init: null"
            )
    record["tokenizer_sha256"] = init_sha
    return {**init, "record": record}


def _model_and_init(
    params: ModelParams,
    objective: Objective,
    manifest: dict,
    manifest_path: Path,
    *,
    init_source: str | None,
    tokenizer_json: Path | None,
    import_init: ImportInit | None,
) -> tuple[BertConfig, dict | None]:
    """The model config and the ``pretrain.init`` checkpoint (None: a random init); an init's
    architecture wins over ``params`` (whose dropout / attention_dropout still apply)."""
    config = objective.model_config(config_from_params(params, vocab_size=int(manifest["vocab_size"])))
    init = (
        _init_checkpoint(init_source, manifest["tokenizer_sha256"], tokenizer_json, import_init)
        if init_source
        else None
    )
    if init is not None:
        given = params.overrides()
        drop = {k: given[k] for k in ("dropout", "attention_dropout") if k in given}
        config = objective.model_config(BertConfig.from_dict({**init["model_config"], **drop}))
    if manifest["max_seq_len"] > config.max_position:
        raise BertraceError(
            f"{manifest_path}: max_seq_len {manifest['max_seq_len']} exceeds the model's max_position "
            f"{config.max_position}; raise pretrain.model.max_position or lower examples.max_seq_len"
        )
    return config, init


def _load_data(cfg: PretrainConfig, examples_dir: Path, tokenizer_json: Path | None, rank: int, world: int):
    """(manifest, its sha256, train data, valid data or None, per-rank micro-batch)."""
    manifest = load_manifest(examples_dir)
    manifest_path = examples_dir / "manifest.json"
    manifest_sha = sha256_file(manifest_path)
    is_cont = None
    if manifest["masking"] == "dynamic" and manifest.get("whole_word_masking"):
        if tokenizer_json is None:
            raise BertraceError(
                f"{manifest_path}: dynamic whole-word masking needs the tokenizer; "
                "pass tokenizer_json (data/tokenizer/tokenizer.json)"
            )
        if sha256_file(tokenizer_json) != manifest["tokenizer_sha256"]:
            raise BertraceError(
                f"{tokenizer_json}: sha256 differs from the tokenizer_sha256 in {manifest_path}; "
                "rerun the examples stage (dvc repro examples)"
            )
        is_cont = continuation_table(tokenizer_json)
    if cfg.batch_size % (cfg.grad_accum * world):
        raise BertraceError(
            f"params.yaml: pretrain.batch_size = {cfg.batch_size} must be a multiple of "
            f"grad_accum ({cfg.grad_accum}) x processes ({world})"
        )
    micro = cfg.batch_size // (cfg.grad_accum * world)
    train_data = PretrainingData(
        examples_dir,
        "train",
        batch_size=micro,
        seed=cfg.seed,
        rank=rank,
        world_size=world,
        shuffle_buffer=cfg.shuffle_buffer,
        is_continuation=is_cont,
    )
    valid_data = None
    if manifest["splits"].get("valid", {}).get("rows"):
        valid_data = PretrainingData(
            examples_dir, "valid", batch_size=micro, seed=cfg.seed, rank=rank, world_size=world, is_continuation=is_cont
        )
    return manifest, manifest_sha, train_data, valid_data, micro


def _provenance(given: dict, cfg: PretrainConfig, setup: _Setup) -> dict:
    """The stage's ``given`` record completed with the run's inputs, software, device and init."""
    rt, init = setup.rt, setup.init
    provenance = json.loads(
        canonical_json(
            {
                **given,
                "tokenizer_sha256": setup.manifest["tokenizer_sha256"],
                "examples_manifest_sha256": setup.manifest_sha,
                "torch": torch.__version__,
                "device": str(rt.device),
                "precision": rt.precision,
                "world_size": setup.world,
                "determinism": rt.determinism,
                "objective": cfg.objective,
                **({"init": init["record"]} if init else {}),
                "arithmetic": arithmetic_state(rt.device, rt.precision, threads_fixed=bool(cfg.num_threads)),
            }
        )
    )
    if init is not None and init["provenance"].get("stage") == "imported":  # trace: "imported from ..." at the root
        provenance["upstream"] = {**(provenance.get("upstream") or {}), "imported": init["provenance"]}
    return provenance


def _clear_stale(out_dir: Path, curves_dir: Path, *, fresh: bool) -> None:
    """Remove what a killed run left half-written and, for a fresh run, the previous run's best.pt
    and snapshots."""
    ckpt_lib.remove_stale_temporaries(out_dir)  # left by a run killed while writing
    ckpt_lib.remove_stale_temporaries(curves_dir, (TRAIN_CURVE, VAL_CURVE))
    if fresh:  # a fresh run: the old best.pt and snapshots belong to another run
        snaps = out_dir / "snapshots"
        for old in [out_dir / ckpt_lib.BEST, *sorted(snaps.glob("minute-*.pt")), *sorted(snaps.glob("step-*.pt"))]:
            old.unlink(missing_ok=True)


def _seeded_model(
    objective: Objective,
    config: BertConfig,
    *,
    seed: int,
    init: dict | None,
    init_source: str | None,
    objective_name: str,
    fresh: bool,
) -> torch.nn.Module:
    """The objective's model, initialised from ``seed`` identically on every rank, with the
    ``pretrain.init`` weights on a fresh run (a resumed run continues its own weights)."""
    torch.manual_seed(seed)  # identical initialisation on every rank
    random.seed(seed)  # unused by training, but saved in last.pt: seeded, so the file is the same too
    np.random.seed(seed)
    model = objective.build_model(config)
    if init is not None and fresh:
        try:
            model.load_state_dict(init["model"])
        except RuntimeError as e:
            raise BertraceError(
                f"params.yaml: pretrain.init {init_source}: its weights do not fit the "
                f"{type(model).__name__} of objective {objective_name} ({str(e).splitlines()[0][:300]} "
                "...); continue pre-training with the objective it was trained with"
            ) from None
    return model


def _embedding_init(
    model: torch.nn.Module,
    params: EmbeddingInit,
    *,
    init: dict | None,
    state: dict | None,
    examples_dir: Path,
    manifest: dict,
    std: float,
    progress: bool,
) -> tuple[dict | None, dict[str, float]]:
    """``pretrain.embedding_init`` on a fresh run without ``pretrain.init`` (a resume has its
    weights): its provenance record (a resumed run's own) and its timing."""
    if params.method != "random" and init is not None:
        raise BertraceError(
            "params.yaml: pretrain.embedding_init.method is skipgram but pretrain.init starts from "
            "trained weights; set one of them (embedding_init.method: random to continue pre-training)"
        )
    record = (state.get("provenance") or {}).get("embedding_init") if state is not None else None
    timings = {}
    if params.method != "random" and init is None and state is None:
        start = time.perf_counter()
        record = initialise_embedding(model, examples_dir, manifest, params, std=std, progress=progress)
        timings["embedding_init_seconds"] = round(time.perf_counter() - start, 1)  # before the first update
    return record, timings


def _trainer(cfg: PretrainConfig, setup: _Setup, model: torch.nn.Module, state: dict | None, **dirs_and_log) -> Trainer:
    """The :class:`Trainer` of ``model``, restored from a resumed ``state``, over DDP when there are
    several ranks, compiled when ``cfg.compile``; ``dirs_and_log``: ``out_dir``, ``curves_dir``,
    ``provenance``, ``on_log``."""
    rt, rank, world = setup.rt, setup.rank, setup.world
    trainer = Trainer(
        cfg,
        setup.objective,
        model=model,
        config=setup.config,
        train_data=setup.train_data,
        valid_data=setup.valid_data,
        device=rt.device,
        autocast_dtype=rt.autocast_dtype,
        use_scaler=rt.use_scaler,
        world=world,
        rank=rank,
        micro=setup.micro,
        **dirs_and_log,
    )
    if state is not None:
        trainer.restore(state)
    else:
        torch.manual_seed(cfg.seed + rank)  # dropout differs across ranks
    if world > 1:
        trainer.model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None
        )
    if cfg.compile:
        # dynamic: batches differ in length and masked count from the first one on; static
        # shapes would recompile (tens of seconds) as soon as the second batch arrives
        trainer.model = torch.compile(trainer.model, dynamic=True)
    return trainer


def _budget(cfg: PretrainConfig, train_data: PretrainingData, state: dict | None) -> Budget:
    """The run's :class:`Budget`; a resumed run records the earlier budgets it extends."""
    extends = extended_budgets(state, cfg) if state is not None else None
    total_steps = budget_steps(
        max_steps=cfg.max_steps,
        epochs=cfg.epochs,
        grad_accum=cfg.grad_accum,
        batches_per_epoch=train_data.batches_per_epoch,
    )
    kind = cfg.budget_kind
    return Budget(kind, getattr(cfg, kind), peak=cfg.lr, warmup=cfg.warmup, total_steps=total_steps, extends=extends)


def _fit(trainer: Trainer, budget: Budget, *, deterministic: bool, device: torch.device, **fit_kw) -> bool:
    """``trainer.fit``; an operation without a deterministic kernel says how to run it."""
    try:
        return trainer.fit(budget, **fit_kw)
    except RuntimeError as e:
        if deterministic and "deterministic" in str(e):
            raise BertraceError(
                f"pretrain.deterministic: {e}\nThis operation has no deterministic kernel on "
                f"{device}; set pretrain.deterministic: false in params.yaml to run it (the "
                "run is then not bit-reproducible)"
            ) from None
        raise


class _Setup(NamedTuple):
    """A run before any weights: its ranks, objective, device, data, model config and init."""

    rank: int
    world: int
    objective: Objective
    rt: _Runtime
    manifest: dict
    manifest_sha: str
    train_data: PretrainingData
    valid_data: PretrainingData | None
    micro: int
    config: BertConfig
    init: dict | None


def _setup(
    cfg: PretrainConfig, examples_dir: Path, tokenizer_json: Path | None, import_init: ImportInit | None
) -> _Setup:
    """Ranks, objective, device and precision, the examples (checked against the objective), the
    model config and the ``pretrain.init`` checkpoint."""
    rank, world = rank_and_world()
    objective = make_objective(cfg)
    rt = _runtime(cfg.device, cfg.precision, deterministic=cfg.deterministic, tf32=cfg.tf32)
    objective.prepare(load_manifest(examples_dir), examples_dir)  # shards of its kind (examples.mode)?
    manifest, manifest_sha, train_data, valid_data, micro = _load_data(cfg, examples_dir, tokenizer_json, rank, world)
    config, init = _model_and_init(
        cfg.model,
        objective,
        manifest,
        examples_dir / "manifest.json",
        init_source=cfg.init,
        tokenizer_json=tokenizer_json,
        import_init=import_init,
    )
    return _Setup(rank, world, objective, rt, manifest, manifest_sha, train_data, valid_data, micro, config, init)


def _pretrain(
    cfg: PretrainConfig,
    *,
    examples_dir: Path,
    out_dir: Path,
    provenance: dict,
    resume: bool | str,
    on_log,
    progress: bool,
    tokenizer_json: Path | None,
    curves_dir: Path,
    stop_at_step: int | None,
    import_init: ImportInit | None,
) -> dict:
    setup = _setup(cfg, examples_dir, tokenizer_json, import_init)
    main, manifest, config, init = setup.rank == 0, setup.manifest, setup.config, setup.init
    provenance = _provenance(provenance, cfg, setup)
    state = resume_state(
        resume,
        out_dir / ckpt_lib.LAST,
        cfg,
        config,
        out_dir,
        setup.rt.device,
        setup.rank,
        setup.world,
        tokenizer_sha=manifest["tokenizer_sha256"],
        manifest_sha=setup.manifest_sha,
        manifest_path=examples_dir / "manifest.json",
    )
    if main:
        _clear_stale(out_dir, curves_dir, fresh=state is None)

    model = _seeded_model(
        setup.objective,
        config,
        seed=cfg.seed,
        init=init,
        init_source=cfg.init,
        objective_name=cfg.objective,
        fresh=state is None,
    )
    embedding_record, timings = _embedding_init(
        model,
        cfg.embedding_init,
        init=init,
        state=state,
        examples_dir=examples_dir,
        manifest=manifest,
        std=config.initializer_range,
        progress=progress and main,
    )
    if embedding_record is not None:
        provenance = {**provenance, "embedding_init": embedding_record}
    trainer = _trainer(
        cfg,
        setup,
        model.to(setup.rt.device),
        state,
        out_dir=out_dir,
        curves_dir=curves_dir,
        provenance=provenance,
        on_log=on_log,
    )
    budget = _budget(cfg, setup.train_data, state)
    trainer.provenance = {**provenance, "budget": budget.record()}
    completed = _fit(
        trainer,
        budget,
        deterministic=cfg.deterministic,
        device=setup.rt.device,
        stop_at_step=stop_at_step,
        progress=progress,
        fresh=state is None,
    )
    flops_tok = setup.objective.flops_per_token(config, manifest)
    precision = setup.rt.precision
    return {**trainer.summary(completed, flops_tok, precision), **trainer.timings(flops_tok, precision), **timings}
