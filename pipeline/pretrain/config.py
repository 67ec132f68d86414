"""The ``pretrain`` section of params.yaml: :class:`PretrainConfig` and its checks.

Exactly one budget (:data:`BUDGETS`): ``max_steps`` or ``epochs`` (counts of updates, reproducible)
or ``time_minutes`` (wall clock, as in cramming: Geiping & Goldstein 2022, section 3). The recipe's
defaults are Google's ``run_pretraining.py`` / ``optimization.py`` (Devlin et al. 2019, appendix A.2).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_serializer, field_validator, model_validator

from pipeline.core.config import Bool, Float, Int, Section, Str, format_errors
from pipeline.core.errors import BertraceError
from pipeline.core.io import canonical_json
from pipeline.models.bert import ModelParams
from pipeline.pretrain.objectives.bert import MlmNspParams
from pipeline.pretrain.objectives.electra import ElectraParams
from pipeline.pretrain.objectives.registry import OBJECTIVES
from pipeline.pretrain.wordvec import EmbeddingInit

BUDGETS = ("max_steps", "epochs", "time_minutes")


Positive = Annotated[Int, Field(ge=1)]
NotNegative = Annotated[Int, Field(ge=0)]
NotNegativeFloat = Annotated[Float, Field(ge=0)]
AboveZero = Annotated[Float, Field(gt=0)]
_SNAPSHOT = "e.g. snapshot_steps: [2000, 4000] or snapshot_minutes: [15, 30]"


class PretrainConfig(Section):
    """The ``pretrain`` section of params.yaml; the defaults are params.yaml's values."""

    SECTION = "pretrain"

    objective: Str = "mlm_nsp"  # what is learnt: an OBJECTIVES name (pipeline/pretrain/objectives/<name>.py)
    # a preset (tiny|mini|small|medium|base|large) and BertConfig overrides (pipeline/models/bert.py)
    model: ModelParams = ModelParams(preset="tiny", dropout=0.0, attention_dropout=0.0)
    # continued pre-training: start from these weights (our .pt, or a Hugging Face model directory / hub
    # pointer file, which stages/pretrain.py imports with pipeline/interop/hf_import.py) instead of a random init; its architecture wins over `model`
    # (whose dropout / attention_dropout still apply); null: random init
    init: Str | None = None
    batch_size: Positive = 32  # examples per optimizer update, all ranks and accumulation steps together
    grad_accum: Positive = 1  # micro-batches per update
    lr: AboveZero = 1e-3  # peak learning rate
    # < 1: fraction of the budget; >= 1: number of updates
    warmup: Annotated[Float, Field(ge=0, description="a fraction < 1 of the budget, or a number of updates")] = 0.06
    weight_decay: NotNegativeFloat = 0.01
    betas: tuple[Float, Float] = (0.9, 0.999)
    eps: AboveZero = 1e-6
    clip_grad_norm: NotNegativeFloat = 1.0  # 0 disables clipping
    mlm_nsp: MlmNspParams = MlmNspParams()  # objective mlm_nsp: the NSP term's weight
    electra: ElectraParams = ElectraParams()  # objective electra: generator size, discriminator loss weight
    embedding_init: EmbeddingInit = EmbeddingInit()  # random, or skip-gram vectors from the examples (wordvec.py)
    # budget: exactly one of these
    max_steps: NotNegative | None = 8000  # optimizer updates (reproducible)
    epochs: NotNegativeFloat | None = None  # passes over the training shards, may be fractional (reproducible)
    time_minutes: NotNegativeFloat | None = None  # wall clock, the lr schedule follows elapsed time (NOT reproducible)
    # keep the weights at these updates (snapshots/step-000500.pt)
    snapshot_steps: Annotated[list[Annotated[Int, Field(gt=0)]], Field(description=_SNAPSHOT)] = [2000, 4000]
    # ... and/or at these elapsed minutes (snapshots/minute-015.pt; wall clock)
    snapshot_minutes: Annotated[list[Annotated[Float, Field(gt=0)]], Field(description=_SNAPSHOT)] = []
    eval_every: NotNegative = 500  # updates between validations (0: only at the end)
    eval_batches: NotNegative | None = (
        20  # validation batches of batch_size (global) examples per evaluation (None/0: all)
    )
    log_every: Positive = 20  # updates between training-metric logs
    checkpoint_every: NotNegative | None = 500  # updates between checkpoints (None/0: off)
    checkpoint_minutes: NotNegativeFloat | None = None  # and/or minutes between checkpoints (None/0: off; wall clock)
    shuffle_buffer: Int = 10_000  # examples in each rank's shuffle buffer
    seed: Int = 0
    device: Str = "auto"  # auto (cuda -> mps -> cpu) | cpu | cuda | cuda:N | mps
    precision: Literal["auto", "fp32", "bf16", "fp16"] = (
        "auto"  # auto: bf16 (else fp16) on CUDA; bf16 on CPUs with bf16 instructions, else fp32
    )
    tf32: Bool = True  # TensorFloat-32 matmuls on Ampere+ GPUs
    compile: Bool = False  # torch.compile the model (dynamic shapes; compile time is not in time_minutes)
    num_threads: NotNegative = 2  # torch CPU threads (0: torch's default, the host's core count)
    deterministic: Bool = True  # deterministic kernels (pipeline/core/device.py); no cost on the CPU
    verify_shards: Bool = True  # rehash the example shards against their manifest before training
    resume: Literal["auto", True, False] = "auto"  # the stage's resume= (see pretrain()); --no-resume wins

    def __init__(self, **data: Any):
        """Keyword construction, with the same errors as :meth:`from_params`."""
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise BertraceError(format_errors(e, type(self), self.SECTION, "params.yaml")) from None

    def __setattr__(self, name: str, value: Any):
        try:
            super().__setattr__(name, value)
        except ValidationError as e:
            raise BertraceError(format_errors(e, type(self), self.SECTION, "params.yaml")) from None

    @field_validator("objective")
    @classmethod
    def _objective(cls, v: str) -> str:
        if v == "bert":
            raise ValueError(
                "'bert' is now called mlm_nsp (MLM + NSP, as BERT); use objective: mlm_nsp, or mlm "
                "for the masked LM alone (the former nsp_weight: 0)"
            )
        if v not in OBJECTIVES:
            raise ValueError(f"must be one of {', '.join(sorted(OBJECTIVES))} (pipeline/pretrain/objectives/)")
        return v

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data):
        if isinstance(data, dict) and "nsp_weight" in data:
            raise ValueError(
                f"nsp_weight = {data['nsp_weight']!r} is gone: remove it and set objective: mlm_nsp "
                "(MLM + NSP, its weight in mlm_nsp.nsp_weight) or objective: mlm (the former "
                "nsp_weight: 0)"
            )
        return data

    @field_serializer("model")
    def _model_as_written(self, model: ModelParams) -> dict:
        return model.to_dict()  # the keys given, as checkpoints have always recorded them

    @field_validator("resume", mode="before")
    @classmethod
    def _resume(cls, v):
        if v != "auto" and not isinstance(v, bool):
            raise ValueError("must be auto, true or false")
        return v

    @field_validator("betas", mode="before")
    @classmethod
    def _two_betas(cls, v):
        if not isinstance(v, (list, tuple)) or len(v) != 2:
            raise ValueError("must be two numbers, e.g. [0.9, 0.999]")
        return v

    @field_validator("snapshot_steps", "snapshot_minutes")
    @classmethod
    def _in_order(cls, v: list) -> list:
        return sorted(v)

    @model_validator(mode="after")
    def _recipe(self) -> "PretrainConfig":
        for name in BUDGETS:
            if getattr(self, name) == 0:
                unit = "1 update" if name == "max_steps" else "a positive number"
                raise BertraceError(
                    f"params.yaml: pretrain.{name} = 0: a budget of nothing trains nothing; set it to at "
                    f"least {unit}, or to null and give the budget as {' or '.join(b for b in BUDGETS if b != name)}"
                )
        budgets = [n for n in BUDGETS if getattr(self, n) is not None]
        if len(budgets) != 1:
            raise BertraceError(
                "params.yaml: pretrain needs exactly one budget: max_steps, epochs or time_minutes "
                f"(got {budgets or 'none'}); set the others to null"
            )
        if self.batch_size % self.grad_accum:
            raise BertraceError(
                f"params.yaml: pretrain.batch_size = {self.batch_size}: must be a multiple of "
                f"grad_accum ({self.grad_accum}); fix it in params.yaml"
            )
        if self.time_minutes and self.warmup >= 1:
            raise BertraceError(
                f"params.yaml: pretrain.warmup = {self.warmup!r}: with a time_minutes budget give "
                "warmup as a fraction of the budget (e.g. 0.06)"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (what checkpoints store as ``train_config`` and resume compares)."""
        return json.loads(canonical_json(self.model_dump(mode="json")))

    @property
    def budget_kind(self) -> str:
        """max_steps | epochs | time_minutes: the one budget set."""
        return next(n for n in BUDGETS if getattr(self, n) not in (None, 0))

    @property
    def wall_clock(self) -> bool:
        """Whether the wall clock decides what the run does (a ``time_minutes`` budget, minute
        snapshots or checkpoints): its checkpoints then keep ``train_seconds`` to resume from."""
        return bool(self.time_minutes or self.snapshot_minutes or self.checkpoint_minutes)
