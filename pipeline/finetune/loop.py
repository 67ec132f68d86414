"""Fine-tuning a pre-trained encoder on a classification task (run_classifier.py, Devlin et al.
2018 section 4.1): pooled vector -> dropout -> Linear, cross-entropy, AdamW. The pooler (dense +
tanh, pre-trained by NSP) reads [CLS] as Google's, or with ``pooling: mean`` the mean of the last
layer over the unpadded tokens (Reimers & Gurevych 2019's mean pooling).

The encoder comes from a pre-training checkpoint: its config (never re-typed in params) and,
in ``full`` / ``frozen`` mode, its ``bert.*`` weights; the MLM and NSP heads are dropped and the
classifier starts fresh. Modes:

* ``full``: every weight trains (the paper's fine-tuning);
* ``frozen``: the encoder is frozen (``requires_grad=False``, kept in eval mode so no dropout
  noise) and only the classifier on the pooled vector learns: a linear probe;
* ``scratch``: the same architecture, randomly initialised: what pre-training buys.

Optimisation follows Google's ``optimization.py``: AdamW with eps 1e-6, no weight decay on
biases and LayerNorm, linear warm-up over ``warmup`` (a fraction) of the steps then linear decay to 0,
gradient clipping at global norm 1.0. Validation accuracy is measured after every epoch (or
every ``eval_every_steps``); training stops after ``patience`` checks without improvement and
the best weights are kept. Several seeds give mean ± std (fine-tuning BERT is notoriously
seed-sensitive on small tasks: Dodge et al. 2020); the model of the best seed is the one saved.

``finetune.task.type`` (:mod:`pipeline.finetune.tasks.registry`) changes the head, the loss and the metric
that picks the best check and seed: ``token_classification`` (NER) is BertForTokenClassification,
cross-entropy at each word's first sub-token, entity-level F1 (seqeval); ``regression`` (STS-B) is
the sequence head with one output, mean squared error, Pearson r (STS-B's official metric;
Spearman and MSE are reported too). See :mod:`pipeline.finetune.tasks`.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Annotated, Any, Callable, ClassVar, ContextManager, Literal

import torch
from pydantic import Field, field_validator

from pipeline.core.config import Bool, Float, Int, Section, Str
from pipeline.core.device import amp_dtype, build_adamw, resolve_device
from pipeline.core.errors import BertraceError
from pipeline.finetune.results import SeedResult, summarize
from pipeline.finetune.task_data import TaskData, TaskParams, TaskSplit
from pipeline.finetune.tasks.registry import get
from pipeline.models.bert import BertConfig, BertForSequenceClassification, param_groups
from pipeline.models.checkpoint import is_causal_checkpoint
from pipeline.pretrain.schedule import linear_warmup_decay

MODES = ("full", "frozen", "scratch")


class FinetuneConfig(Section):
    """The ``finetune`` section of params.yaml (defaults equal params.yaml; tests/unit/core/test_config.py).

    The optimizer keys are named as in ``pretrain``: ``lr``, ``warmup`` (a fraction of the
    planned steps), ``weight_decay``, ``betas``, ``eps``, ``clip_grad_norm``."""

    SECTION: ClassVar[str] = "finetune"

    checkpoint: Str = "data/pretrain/best.pt"  # falls back to last.pt; or a HF model dir / hub pointer (hf_import)
    tokenizer: Str = "data/tokenizer/tokenizer.json"  # must be the checkpoint's (sha256 checked); HF: = checkpoint
    mirror: Str = ""  # hub mirror for the task data (env BERTRACE_HUB_MIRROR does the same)
    task: TaskParams = TaskParams()  # pipeline/finetune/task_data.py
    mode: Literal["full", "frozen", "scratch"] = "full"
    max_len: Annotated[Int, Field(ge=8)] = 64
    truncation: Literal["head", "head_tail"] = "head"
    epochs: Annotated[Int, Field(ge=1)] = 1
    batch_size: Annotated[Int, Field(ge=1)] = 32
    eval_batch_size: Annotated[Int, Field(ge=1)] = 128
    lr: Annotated[Float, Field(gt=0)] = 2e-4
    weight_decay: Annotated[Float, Field(ge=0)] = 0.01
    warmup: Annotated[Float, Field(ge=0, lt=1)] = 0.1  # fraction of the planned steps
    betas: tuple[Float, Float] = (0.9, 0.999)
    eps: Annotated[Float, Field(gt=0)] = 1e-6
    clip_grad_norm: Annotated[Float, Field(ge=0)] = 1.0  # 0 = no clipping
    dropout: Annotated[Float, Field(ge=0, lt=1)] | None = 0.1  # classifier; null = the encoder's hidden dropout
    encoder_dropout: Annotated[Float, Field(ge=0, lt=1)] | None = 0.1  # null = the checkpoint's (pre-training's)
    pooling: Literal["cls", "mean"] = "mean"  # the pooler's input: [CLS] (BERT) or the mean over the tokens
    layer_lr_decay: Annotated[Float, Field(gt=0, le=1)] = 1.0  # ELECTRA's layer-wise lr decay; 1.0 = one lr for all
    patience: Annotated[Int, Field(ge=0)] = 2  # checks without improvement before stopping; 0 = never stop early
    eval_every_steps: Annotated[Int, Field(ge=0)] = 0  # 0 = once per epoch
    group_by_length: Bool = True  # batches of similar length: less padding, same examples per epoch
    seeds: list[Annotated[Int, Field(ge=0)]] = Field(default_factory=lambda: [0, 1, 2, 3, 4], min_length=1)
    log_every_steps: Annotated[Int, Field(ge=1)] = 50
    threads: Annotated[Int, Field(ge=0)] = 2  # torch CPU threads, also evaluate's (0: the host's core count)
    device: Str = "auto"  # auto | cpu | cuda | cuda:N | mps

    @field_validator("seeds", mode="before")
    @classmethod
    def _one_seed(cls, v):
        return [v] if isinstance(v, int) and not isinstance(v, bool) else v  # seeds: 0 means [0]

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v):
        if len(set(v)) != len(v):
            raise ValueError(f"repeats a seed; give distinct seeds, e.g. {sorted(set(v))}")
        return v


SHARED_KEYS = ("checkpoint", "tokenizer")  # a variant's DVC deps are finetune's: it cannot change them


def variant_params(finetune_params: dict, overrides: Any, name: str) -> dict:
    """The ``finetune`` section with variant ``name``'s overrides (params.yaml ``finetune_variants``)
    applied: a nested dict (``task``) is merged key by key, anything else replaced. Unknown keys and
    the shared ones (the checkpoint and tokenizer, which dvc.yaml tracks for every variant) are errors
    naming ``finetune_variants.<name>.<key>``."""
    where = f"params.yaml: finetune_variants.{name}"
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict):
        raise BertraceError(
            f"{where}: expected a mapping of finetune keys to values (e.g. {{mode: frozen, lr: 1.0e-3}}), "
            f"got {type(overrides).__name__} {overrides!r}"
        )
    known = set(FinetuneConfig.model_fields)
    for key in overrides:
        if key in SHARED_KEYS:
            raise BertraceError(
                f"{where}.{key}: every variant fine-tunes finetune.{key} (a DVC dependency of the "
                f"variant stages); remove the key, or compare checkpoints with `dvc exp run -S finetune.{key}=...`"
            )
        if key not in known:
            raise BertraceError(f"{where}.{key}: not a finetune key; use one of {sorted(known - set(SHARED_KEYS))}")

    def merge(base: Any, over: Any) -> Any:
        if isinstance(base, dict) and isinstance(over, dict):
            return {**base, **{k: merge(base.get(k), v) for k, v in over.items()}}
        return over

    return merge(dict(finetune_params), overrides)


# ---------------------------------------------------------------------------------------------
# Transplant: pre-training checkpoint -> classifier
# ---------------------------------------------------------------------------------------------
def finetuned_model_config(ckpt: dict[str, Any], pooling: str = "cls", task_type: str = "classification") -> dict:
    """The checkpoint's model config with the sequence classifier's ``classifier_pooling`` set to
    ``pooling`` (``cls`` | ``mean``, see :class:`~pipeline.models.bert.BertConfig`): the config
    a fine-tuned ``model.pt`` records, so that evaluate, predict and export rebuild its forward.
    Token classification (every position) and a GPT decoder (its last real token) do not pool."""
    config = dict(ckpt["model_config"])
    config.pop("classifier_pooling", None)
    if pooling != "cls" and get(task_type).pools and not is_causal_checkpoint(ckpt):
        config["classifier_pooling"] = pooling
    return config


def build_model(
    ckpt: dict[str, Any],
    num_labels: int,
    mode: str = "full",
    *,
    dropout: float | None = None,
    encoder_dropout: float | None = None,
    pooling: str = "cls",
    seed: int = 0,
    source: str = "checkpoint",
    task_type: str = "classification",
) -> BertForSequenceClassification:
    """BertForSequenceClassification (BertForTokenClassification for ``task_type``
    token_classification; regression is sequence classification with ``num_labels`` 1) with the
    checkpoint's config; encoder weights loaded for ``full`` / ``frozen``, random (seeded) for
    ``scratch``; encoder frozen for ``frozen``.

    ``encoder_dropout`` replaces the checkpoint's hidden and attention dropout: a model
    pre-trained without dropout (short budgets, Geiping & Goldstein 2022 "Cramming", sec. 4.3)
    is fine-tuned with it switched back on. ``pooling``: :func:`finetuned_model_config`."""
    if mode not in MODES:
        raise BertraceError(f"params.yaml: finetune.mode is {mode!r}; use one of {list(MODES)}")
    model_config = finetuned_model_config(ckpt, pooling, task_type)
    if encoder_dropout is not None:
        model_config.update(dropout=float(encoder_dropout), attention_dropout=float(encoder_dropout))
    config = BertConfig.from_dict(model_config)
    torch.manual_seed(seed)  # classifier (and, for scratch, encoder) initialisation
    if is_causal_checkpoint(ckpt):  # pretrain.objective clm: a GPT decoder, last-token pooling
        return _build_gpt(ckpt, config, num_labels, mode, dropout=dropout, source=source, task_type=task_type)
    model = get(task_type).head_class()(config, num_labels, classifier_dropout=dropout)
    if mode != "scratch":
        model.load_pretrained_encoder(ckpt["model"], source=str(source))
    if mode == "frozen":
        for p in backbone(model).parameters():
            p.requires_grad_(False)
    return model


def _build_gpt(
    ckpt: dict[str, Any],
    config: BertConfig,
    num_labels: int,
    mode: str,
    *,
    dropout: float | None,
    source: str,
    task_type: str,
) -> torch.nn.Module:
    """:class:`pipeline.models.gpt.GPTForSequenceClassification` (the last real token's hidden state, as
    ``GPT2ForSequenceClassification``) on a ``clm`` checkpoint's decoder: loaded for ``full`` /
    ``frozen``, random (seeded by the caller) for ``scratch``, frozen for ``frozen``."""
    from pipeline.models.gpt import GPTForSequenceClassification

    get(task_type).check_decoder(source)
    model = GPTForSequenceClassification(config, num_labels, classifier_dropout=dropout)
    if mode != "scratch":
        model.load_pretrained_decoder(ckpt["model"], source=str(source))
    if mode == "frozen":
        for p in model.gpt.parameters():
            p.requires_grad_(False)
    return model


def backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The pre-trained part of a fine-tuning model: the encoder (``bert``) or the decoder (``gpt``)."""
    return model.gpt if hasattr(model, "gpt") else model.bert


def layer_depth(name: str, num_layers: int) -> int:
    """A parameter's depth for layer-wise lr decay, as google-research/electra's
    ``optimization._get_layer_lrs``: the embeddings (and their projection) 0, encoder / decoder
    layer i is i + 1, everything else (pooler, final LayerNorm, the task head) num_layers + 2."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in ("layers", "blocks") and parts[i + 1].isdigit():
            return int(parts[i + 1]) + 1
    if any(part.startswith(("embeddings", "wte", "wpe")) for part in parts):
        return 0
    return num_layers + 2


def layerwise_lr_groups(model: torch.nn.Module, lr: float, weight_decay: float, decay: float = 1.0) -> list[dict]:
    """AdamW groups for fine-tuning: ``param_groups``' weight-decay split, and with ``decay`` < 1 a
    learning rate of ``lr * decay ** (num_layers + 2 - depth)`` per depth (:func:`layer_depth`):
    lower rates nearer the input, so fine-tuning moves the pre-trained lower layers less (ELECTRA's
    fine-tuning, Clark et al. 2020, appendix A: 0.8 for Small). Frozen parameters are left out."""
    num_layers = len(backbone(model).blocks if hasattr(model, "gpt") else backbone(model).layers)
    named = {id(p): n for n, p in model.named_parameters()}
    by_depth: dict[int, list[dict]] = {}
    for group in param_groups(model, weight_decay):
        for p in group["params"]:
            depth = num_layers + 2 if decay == 1.0 else layer_depth(named[id(p)], num_layers)
            groups = by_depth.setdefault(depth, [])
            match = next((g for g in groups if g["weight_decay"] == group["weight_decay"]), None)
            if match is None:
                match = {
                    "params": [],
                    "weight_decay": group["weight_decay"],
                    "lr": lr * decay ** (num_layers + 2 - depth),
                }
                groups.append(match)
            match["params"].append(p)
    return [g for depth in sorted(by_depth) for g in by_depth[depth]]


def _set_train_mode(model: BertForSequenceClassification, mode: str) -> None:
    model.train()
    if mode == "frozen":
        backbone(model).eval()  # a frozen encoder is a fixed feature extractor: no dropout in it


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
class LengthGroupedBatches(torch.utils.data.Sampler):
    """Random batches of similar-length examples (Hugging Face's ``group_by_length``): each
    epoch shuffles the examples, sorts each window of ``window`` batches by length, cuts it into
    batches and shuffles the batches. Every example is seen once per epoch; padding (most of the
    compute on short-sentence tasks like SST-2) mostly disappears."""

    def __init__(self, lengths: list[int], batch_size: int, generator: torch.Generator, window: int = 50):
        self.lengths, self.batch_size, self.generator, self.window = lengths, batch_size, generator, window

    def _chunks(self) -> list[int]:
        n, size = len(self.lengths), self.batch_size * self.window
        return [min(size, n - s) for s in range(0, n, size)]

    def __len__(self) -> int:
        return sum(math.ceil(c / self.batch_size) for c in self._chunks())

    def __iter__(self):
        perm = torch.randperm(len(self.lengths), generator=self.generator).tolist()
        size = self.batch_size * self.window
        batches = []
        for s in range(0, len(perm), size):
            chunk = sorted(perm[s : s + size], key=lambda i: self.lengths[i])
            batches += [chunk[j : j + self.batch_size] for j in range(0, len(chunk), self.batch_size)]
        for k in torch.randperm(len(batches), generator=self.generator).tolist():
            yield batches[k]


def task_loss(
    logits: torch.Tensor, labels: torch.Tensor, task_type: str = "classification", reduction: str = "mean"
) -> torch.Tensor:
    """The task type's training loss in float32 (:meth:`~pipeline.finetune.tasks.base.TaskType.loss`:
    cross-entropy, per word for token classification, or the mean squared error of regression)."""
    return get(task_type).loss(logits, labels, reduction=reduction)


def evaluate_split(
    model: torch.nn.Module,
    split: TaskSplit,
    batch_size: int = 128,
    device: torch.device | str = "cpu",
    label_names: list[str] | None = None,
) -> dict[str, float]:
    """The task type's validation metrics on a labelled split (classification ``{"accuracy", "loss",
    "n"}``; token classification, which needs ``label_names``, entity-level ``f1`` / ``precision`` /
    ``recall`` and word ``accuracy``; regression ``pearson`` / ``spearman`` / ``mse``), batches of
    length-sorted examples, on a GPU under autocast (:meth:`~pipeline.finetune.tasks.base.TaskType.evaluate`)."""
    if split.labels is None:
        raise BertraceError(f"{split.source}: the {split.role} split has no labels; accuracy needs a labelled split")
    return get(split.task_type).evaluate(model, split, batch_size, torch.device(device), label_names)


def train_seed(
    ckpt: dict[str, Any],
    data: TaskData,
    cfg: FinetuneConfig,
    seed: int,
    *,
    progress: bool = True,
    log: Callable[[dict[str, float], int], None] | None = None,
    source: str = "checkpoint",
) -> SeedResult:
    """Fine-tune one model with ``seed`` (init, shuffling and dropout all follow it) and return
    its best-validation weights and numbers. ``log(metrics, step)`` receives the training loss
    and learning rate every ``log_every_steps`` and each validation check."""
    from tqdm.auto import tqdm

    train, valid = data.splits.get("train"), data.splits.get("validation")
    if train is None or valid is None:
        raise BertraceError(
            "fine-tuning needs the train and validation splits; load them with roles=('train', 'validation')"
        )
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    device, amp, scaler, pin = _precision(cfg)
    task_type = getattr(data, "task_type", "classification")
    task = get(task_type)
    model = build_model(
        ckpt,
        data.num_labels,
        cfg.mode,
        dropout=cfg.dropout,
        encoder_dropout=cfg.encoder_dropout,
        pooling=cfg.pooling,
        seed=seed,
        source=source,
        task_type=task_type,
    ).to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = layerwise_lr_groups(model, cfg.lr, cfg.weight_decay, cfg.layer_lr_decay)
    optimizer = build_adamw(groups, device, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    generator = torch.Generator().manual_seed(seed)
    loader = _train_loader(train, cfg, generator, task.collate, pin)
    steps_per_epoch = len(loader)
    planned = cfg.epochs * steps_per_epoch
    warmup = int(round(cfg.warmup * planned))
    scheduler = torch.optim.lr_scheduler.LambdaLR(  # Google's ramp: the first update at rate 0
        optimizer, lambda step: linear_warmup_decay(step, warmup=warmup, total=planned, ramp_offset=0)
    )
    eval_every = cfg.eval_every_steps or steps_per_epoch

    def snapshot() -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    checks = _Checks(snapshot)
    step, stopped = 0, False
    # the epoch's loss sum stays on the device (float64, the same sums as Python floats would give)
    epoch_loss, epoch_steps = torch.zeros((), dtype=torch.float64, device=device), 0
    bar = tqdm(total=planned, desc=f"finetune seed {seed}", unit="step", disable=not progress, mininterval=1.0)
    _set_train_mode(model, cfg.mode)
    for _epoch in range(cfg.epochs):
        epoch_loss, epoch_steps = torch.zeros((), dtype=torch.float64, device=device), 0
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
                loss = task.loss(logits, batch["labels"])
            _update(loss, optimizer, scaler, trainable, cfg.clip_grad_norm)
            scheduler.step()
            step += 1
            epoch_loss += loss.detach().double()
            epoch_steps += 1
            bar.update(1)
            if log and step % max(1, cfg.log_every_steps) == 0:
                log({"train_loss": loss.item(), "lr": scheduler.get_last_lr()[0]}, step)
            if step % eval_every == 0 or step == planned:
                ev = evaluate_split(model, valid, cfg.eval_batch_size, device, label_names=data.label_names)
                _set_train_mode(model, cfg.mode)
                point = task.history_point(step, round(step / steps_per_epoch, 4), ev, epoch_loss.item() / epoch_steps)
                score = checks.add(point, ev, task.selection_value(ev))
                bar.set_postfix(val=f"{score:.4f}")
                if log:
                    log({k: v for k, v in point.items() if k not in ("step",)}, step)
                if cfg.patience and checks.bad >= cfg.patience and step < planned:
                    stopped = True
                    break
        if stopped:
            break
    bar.close()
    best = checks.best
    result = SeedResult(
        seed=seed,
        validation_accuracy=best["accuracy"],
        validation_loss=best["loss"],
        best_step=best["step"],
        best_epoch=best["epoch"],
        steps=step,
        planned_steps=planned,
        epochs_run=round(step / steps_per_epoch, 4),
        stopped_early=stopped,
        train_loss=epoch_loss.item() / max(1, epoch_steps),
        history=checks.history,
        cpu_seconds=time.process_time() - t_cpu,
        wall_seconds=time.perf_counter() - t_wall,
        state_dict=checks.state,
        task_type=task_type,
        validation=dict(best["metrics"]),
    )
    if log:
        _log_best(log, task.selection, result, step)
    return result


def _precision(cfg: FinetuneConfig) -> tuple[torch.device, torch.dtype | None, torch.amp.GradScaler, bool]:
    """``(device, autocast dtype, scaler, pin)``. On a GPU: autocast (bf16; fp16 + GradScaler where
    bf16 is only emulated), TF32 matmuls and pinned batches; on the CPU all three are off and results
    are those of plain fp32."""
    device = resolve_device(cfg.device, param="finetune.device")
    amp = amp_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
    pin = device.type == "cuda"
    if pin:
        torch.set_float32_matmul_precision("high")
    return device, amp, scaler, pin


def _update(loss: torch.Tensor, optimizer, scaler: torch.amp.GradScaler, trainable: list, clip: float) -> None:
    """One optimizer step on ``loss``: backward (scaled), global-norm clipping at ``clip`` (0: none), step."""
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if clip:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(trainable, clip)
    scaler.step(optimizer)
    scaler.update()


class _Checks:
    """A seed's validation checks: the history, the best check (the highest selection metric; the
    first check even with a NaN score) with its weights, and the checks since it (``patience``)."""

    def __init__(self, snapshot: Callable[[], dict[str, torch.Tensor]]):
        self.snapshot = snapshot
        self.history: list[dict[str, float]] = []
        self.best = {"accuracy": -1.0, "loss": math.inf, "step": 0, "epoch": 0.0, "score": -math.inf, "metrics": {}}
        self.state = snapshot()
        self.bad = 0

    def add(self, point: dict[str, Any], ev: dict[str, Any], score: float) -> float:
        """Record the check ``point`` with metrics ``ev`` and selection ``score``; returns the score."""
        self.history.append(point)
        if score > self.best["score"] or len(self.history) == 1:
            self.best = {
                "accuracy": ev.get("accuracy", math.nan),
                "loss": ev["loss"],
                "step": point["step"],
                "epoch": point["epoch"],
                "score": score,
                "metrics": ev,
            }
            self.state = self.snapshot()
            self.bad = 0
        else:
            self.bad += 1
        return score


def _train_loader(train: TaskSplit, cfg: FinetuneConfig, generator: torch.Generator, collate, pin: bool):
    """The training batches: length-grouped (``group_by_length``) or plainly shuffled, drawn from ``generator``."""
    if cfg.group_by_length:
        sampler = LengthGroupedBatches([len(x) for x in train.input_ids], cfg.batch_size, generator)
        return torch.utils.data.DataLoader(train, batch_sampler=sampler, collate_fn=collate, pin_memory=pin)
    return torch.utils.data.DataLoader(
        train,
        batch_size=cfg.batch_size,
        shuffle=True,
        collate_fn=collate,
        generator=generator,
        pin_memory=pin,
    )


def _log_best(log: Callable[[dict[str, float], int], None], main: str, result: SeedResult, step: int) -> None:
    """A seed's best check and timings, to its run."""
    log(
        {
            f"best_validation_{main}": result.score,
            "best_step": result.best_step,
            "cpu_seconds": result.cpu_seconds,
            "wall_seconds": result.wall_seconds,
        },
        step,
    )


def finetune(
    ckpt: dict[str, Any],
    data: TaskData,
    cfg: FinetuneConfig,
    *,
    progress: bool = True,
    seed_context: Callable[[int], ContextManager[Callable[[dict[str, float], int], None] | None]] | None = None,
    source: str = "checkpoint",
) -> tuple[dict[str, Any], SeedResult]:
    """Run every seed of ``cfg.seeds``; returns ``(summary, best seed's result)``.

    ``seed_context(seed)``, when given, wraps each seed's training (the stage opens a nested
    MLflow run there) and yields the ``log(metrics, step)`` function that seed reports to."""
    results = []
    best: SeedResult | None = None
    for seed in cfg.seeds:
        with seed_context(seed) if seed_context else contextlib.nullcontext(None) as log:
            r = train_seed(ckpt, data, cfg, seed, progress=progress, source=source, log=log)
        results.append(r)
        if best is None or r.score > best.score:
            best = r
        else:
            r.state_dict = None  # keep only the best weights in memory
    return summarize(results), best


__all__ = [
    "FinetuneConfig",
    "MODES",
    "build_model",
    "finetuned_model_config",
    "evaluate_split",
    "train_seed",
    "finetune",
    "summarize",
    "SeedResult",
    "task_loss",
    "backbone",
]
