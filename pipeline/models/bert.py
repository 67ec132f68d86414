"""BERT (Devlin et al. 2018), written out in the spirit of nanoGPT's model.py (the pieces that need no
config, GELU, dropout, init, the fused loss, are :mod:`pipeline.models.primitives`).

The network is the one Google's released ``modeling.py`` builds:

- embeddings: token + learned absolute position + segment ("token type"), summed without any
  sqrt(d) scaling, then LayerNorm(eps=1e-12) and dropout (``embedding_postprocessor``);
- post-LN Transformer encoder layers: ``x = LN(x + drop(attn(x)))``, ``x = LN(x + drop(ffn(x)))``
  (``transformer_model``), GELU in its tanh form as Google wrote it (exact erf selectable);
  ``pre_ln: true`` selects pre-LN layers instead, ``x = x + drop(attn(LN(x)))``,
  ``x = x + drop(ffn(LN(x)))``, and one more LayerNorm after the last layer (Xiong et al. 2020,
  "On Layer Normalization in the Transformer Architecture"; the Cramming recipe, Geiping &
  Goldstein 2022): gradients stay well scaled without a long warmup, so short budgets can take
  higher peak learning rates. Not Google's BERT, so not exportable to Hugging Face's BERT classes;
- pooler: dense + tanh on the [CLS] vector (``get_pooled_output``);
- pre-training heads (``run_pretraining.py``): masked-LM transform dense -> GELU -> LayerNorm,
  decoder tied to the token embedding plus its own output bias, computed only at the masked
  positions (``gather_indexes``); next-sentence head Linear(H, 2) on the pooled vector.

Parameter names differ from Hugging Face's; ``pipeline/interop/hf.py`` maps
between the two, and tests/unit/models/test_model.py checks logits against ``transformers`` to 1e-5.

Speed levers, all exact (the outputs that are read are the full computation's):
- the MLM head runs on the ~15% masked rows only (at 4 layers / 256 hidden / vocab 16k the
  full-sequence vocabulary projection costs more than the whole encoder);
- so does the last layer's position-wise part (attention output, LayerNorms, FFN): only the
  masked rows and [CLS] are read downstream, so only those are computed;
- query/key/value are one fused (H, 3H) matmul;
- attention is ``F.scaled_dot_product_attention`` with no mask at all when a batch has no
  padding, so the fused kernels apply (on CUDA; on CPU they also need attention dropout off);
  callers that know whether a batch is padded say so (``padded=``; the pre-training loader
  decides it on the host), so neither a GPU→CPU read of the mask nor torch.compile stands in
  the way;
- the embedding may be padded beyond the tokenizer's vocabulary (``vocab_size`` >
  ``tokenizer_vocab_size``, e.g. ``pretrain.model.pad_vocab_to_multiple_of: 64``) so the
  decoder matmul has tensor-core friendly shapes; the extra ids are never input and never
  predicted (the MLM logits stop at ``tokenizer_vocab_size``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Annotated, ClassVar, Literal, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import Field, model_validator

from pipeline.core.config import Bool, Float, Int, Section
from pipeline.core.errors import BertraceError
from pipeline.models.primitives import (
    Dropout,
    attention_written_out,
    gelu,
    init_weights,
    linear_cross_entropy,
    load_strict,
    padding_mask,
    strip_wrappers,
)

# --------------------------------------------------------------------------------------------
# Configuration


@dataclass
class BertConfig:
    vocab_size: int = 16000
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    max_position: int = 512
    type_vocab_size: int = 2
    dropout: float = 0.1  # hidden_dropout_prob: embeddings, attention output, FFN output
    attention_dropout: float = 0.1  # attention_probs_dropout_prob
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    gelu: str = "tanh"  # "tanh" (Google's modeling.py) | "exact" (erf; HF "gelu")
    pad_id: int = 0  # id of [PAD]; exported as HF pad_token_id (masks are never inferred from it)
    # ids the tokenizer has, when vocab_size pads the embedding beyond them (None: all of vocab_size);
    # the MLM head predicts only these
    tokenizer_vocab_size: int | None = None
    # width of the token/position/segment embeddings (None: hidden_size); a smaller one adds a
    # Linear(embedding_size, hidden_size) after them, as ELECTRA's `embedding_size` / embeddings_project
    embedding_size: int | None = None
    # the [CLS] head: "tanh" (BERT's pooler, dense + tanh) | "gelu" (ELECTRA's classification head:
    # dropout, dense, exact GELU; HF ElectraClassificationHead)
    pooler_activation: str = "tanh"
    # pre-LN layers (LayerNorm before attention and FFN, a final LayerNorm after the last layer)
    # instead of BERT's post-LN; see the module docstring
    pre_ln: bool = False
    # what the sequence classifier's pooler reads: "cls" (BERT: the [CLS] vector, run_classifier.py)
    # | "mean" (the last layer averaged over the unpadded positions, as Sentence-BERT's mean
    # pooling, Reimers & Gurevych 2019; ModernBERT's classifier_pooling). Pre-training reads [CLS]
    classifier_pooling: str = "cls"

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "max_position",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BertraceError(f"model config: {name} must be a positive integer, got {value!r}")
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise BertraceError(f"model config: {name} must be a number in [0, 1), got {value!r}")
        if self.hidden_size % self.num_heads != 0:
            raise BertraceError(
                f"model config: hidden_size {self.hidden_size} is not a multiple of num_heads "
                f"{self.num_heads}; pick num_heads dividing hidden_size (BERT uses hidden_size / 64)"
            )
        if self.gelu not in ("tanh", "exact"):
            raise BertraceError(f"model config: gelu must be 'tanh' or 'exact', got {self.gelu!r}")
        e = self.embedding_size
        if e is not None and (not isinstance(e, int) or isinstance(e, bool) or e < 1):
            raise BertraceError(f"model config: embedding_size must be a positive integer or null, got {e!r}")
        if not isinstance(self.pre_ln, bool):
            raise BertraceError(f"model config: pre_ln must be true or false, got {self.pre_ln!r}")
        if self.pooler_activation not in ("tanh", "gelu"):
            raise BertraceError(
                f"model config: pooler_activation must be 'tanh' (BERT) or 'gelu' (ELECTRA), "
                f"got {self.pooler_activation!r}"
            )
        if self.classifier_pooling not in ("cls", "mean"):
            raise BertraceError(
                f"model config: classifier_pooling must be 'cls' or 'mean', got {self.classifier_pooling!r}"
            )
        t = self.tokenizer_vocab_size
        if t is not None and (not isinstance(t, int) or isinstance(t, bool) or not 1 <= t <= self.vocab_size):
            raise BertraceError(
                f"model config: tokenizer_vocab_size must be an integer in [1, vocab_size {self.vocab_size}], got {t!r}"
            )

    @property
    def predicted_vocab_size(self) -> int:
        """Width of the MLM logits: the tokenizer's ids (the padding rows are never predicted)."""
        return self.tokenizer_vocab_size or self.vocab_size

    @property
    def embedding_dim(self) -> int:
        """Width of the embedding tables (``embedding_size``, else ``hidden_size``)."""
        return self.embedding_size or self.hidden_size

    def to_dict(self) -> dict:
        d = asdict(self)
        # fields at their defaults are left out, so older configs read as before (checkpoints, resume)
        for key, default in (
            ("tokenizer_vocab_size", None),
            ("embedding_size", None),
            ("pooler_activation", "tanh"),
            ("pre_ln", False),
            ("classifier_pooling", "cls"),
        ):
            if d[key] == default:
                del d[key]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "BertConfig":
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(valid))
        if unknown:
            raise BertraceError(f"model config: unknown keys {unknown}; valid keys are {valid}")
        return cls(**d)


def _preset(layers: int, hidden: int) -> dict:
    return dict(num_layers=layers, hidden_size=hidden, num_heads=hidden // 64, intermediate_size=4 * hidden)


# The sizes of Google's BERT release (Turc et al. 2019, "Well-Read Students Learn Better"):
# heads = hidden / 64, intermediate = 4 * hidden.
PRESETS: dict[str, dict] = {
    "tiny": _preset(2, 128),
    "mini": _preset(4, 256),
    "small": _preset(4, 512),
    "medium": _preset(8, 512),
    "base": _preset(12, 768),
    "large": _preset(24, 1024),
}


Positive = Annotated[Int, Field(ge=1)]
Rate = Annotated[Float, Field(ge=0, lt=1)]


class ModelParams(Section):
    """``pretrain.model``: a preset of Google's sizes and any :class:`BertConfig` field over it.

    A key left out (or null) takes the preset's value, else :class:`BertConfig`'s default
    (Google's ``modeling.py``: dropout 0.1, GELU tanh, 512 positions). ``vocab_size`` comes from
    the tokenizer; ``pad_vocab_to_multiple_of`` or a larger ``vocab_size`` pads the embedding.
    Cross-field rules (heads dividing hidden_size) are :class:`BertConfig`'s.
    """

    SECTION: ClassVar[str] = "pretrain.model"

    preset: Literal["tiny", "mini", "small", "medium", "base", "large"]
    pad_vocab_to_multiple_of: Positive | None = None  # 64: tensor-core shapes for the decoder (None: 1)
    vocab_size: Positive | None = None  # at least the tokenizer's; larger pads the embedding
    hidden_size: Positive | None = None
    num_layers: Positive | None = None
    num_heads: Positive | None = None
    intermediate_size: Positive | None = None
    max_position: Positive | None = None
    type_vocab_size: Positive | None = None
    dropout: Rate | None = None
    attention_dropout: Rate | None = None
    layer_norm_eps: Annotated[Float, Field(gt=0)] | None = None
    initializer_range: Annotated[Float, Field(gt=0)] | None = None
    gelu: Literal["tanh", "exact"] | None = None
    pad_id: Annotated[Int, Field(ge=0)] | None = None
    embedding_size: Positive | None = None
    pooler_activation: Literal["tanh", "gelu"] | None = None
    pre_ln: Bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_tokenizer_vocab_size(cls, data):
        if isinstance(data, dict) and "tokenizer_vocab_size" in data:
            raise ValueError(
                "tokenizer_vocab_size comes from the tokenizer; remove it (pad the vocabulary with "
                "pad_vocab_to_multiple_of or vocab_size)"
            )
        return data

    def to_dict(self) -> dict:
        """The keys given (None left out): the params as written, as checkpoints record them."""
        return self.model_dump(mode="json", exclude_none=True)

    def overrides(self) -> dict:
        """The :class:`BertConfig` fields these params set (preset and padding left out)."""
        return {k: v for k, v in self.to_dict().items() if k not in ("preset", "pad_vocab_to_multiple_of")}


def config_from_params(
    params: ModelParams | dict, vocab_size: int, source: str = "params.yaml", section: str = "pretrain.model"
) -> BertConfig:
    """Model config from ``pretrain.model`` (:class:`ModelParams`, or its mapping, checked here).

    ``vocab_size`` comes from the tokenizer; ``pad_vocab_to_multiple_of: N`` rounds the embedding
    up to a multiple of N (64: tensor-core shapes for the decoder matmul), and a ``vocab_size`` key
    may enlarge it to a given size. Either way the rows above the tokenizer's vocabulary are
    padding (``tokenizer_vocab_size`` records where it ends): never input, never predicted.
    ``source`` and ``section`` name the file and key in errors.
    """
    if not isinstance(params, ModelParams):
        params = ModelParams.from_params(params, source=source, section=section)
    d = params.overrides()
    override = d.get("vocab_size", vocab_size)
    if override < vocab_size:
        raise BertraceError(
            f"{source}: {section}.vocab_size = {override}: smaller than the tokenizer's "
            f"{vocab_size}; remove the override or make it >= {vocab_size}"
        )
    multiple = params.pad_vocab_to_multiple_of or 1
    d["vocab_size"] = -(-override // multiple) * multiple
    if d["vocab_size"] > vocab_size:
        d["tokenizer_vocab_size"] = vocab_size
    return BertConfig(**{**PRESETS[params.preset], **d})


# --------------------------------------------------------------------------------------------
# The network


class Embeddings(nn.Module):
    """modeling.py ``embedding_lookup`` + ``embedding_postprocessor``."""

    def __init__(self, config: BertConfig):
        super().__init__()
        E = config.embedding_dim
        self.word = nn.Embedding(config.vocab_size, E)
        self.position = nn.Embedding(config.max_position, E)
        self.segment = nn.Embedding(config.type_vocab_size, E)
        self.ln = nn.LayerNorm(E, eps=config.layer_norm_eps)
        self.drop = Dropout(config.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        T = input_ids.size(1)
        x = self.word(input_ids) + self.position.weight[:T]  # [B, T, H] + [T, H]
        if token_type_ids is None:
            x = x + self.segment.weight[0]
        else:
            x = x + self.segment(token_type_ids)
        return self.drop(self.ln(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention; q, k, v projections fused into one (H, 3H) matmul.

    ``rows`` (flat indices into B*T): apply the output projection only at those positions and
    return [R, H] instead of [B, T, H]; the attention itself still runs over all positions."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_dropout = config.attention_dropout

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rows: torch.Tensor | None = None) -> torch.Tensor:
        B, T, H = x.shape
        q, k, v = self.qkv(x).split(H, dim=2)
        q, k, v = (t.view(B, T, self.num_heads, H // self.num_heads).transpose(1, 2) for t in (q, k, v))
        # mask: bool [B, 1, 1, T], True = attend. Softmax(QK^T / sqrt(d)) V with dropout on the
        # probabilities, as modeling.py attention_layer.
        dropout_p = self.attention_dropout if self.training else 0.0
        if x.device.type == "cpu" and torch.is_grad_enabled():
            y = attention_written_out(q, k, v, mask, dropout_p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        y = y.transpose(1, 2).reshape(B, T, H)
        if rows is not None:
            y = y.reshape(B * T, H).index_select(0, rows)
        return self.proj(y)


class FeedForward(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.fc = nn.Linear(config.hidden_size, config.intermediate_size)
        self.proj = nn.Linear(config.intermediate_size, config.hidden_size)
        self.gelu = config.gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(gelu(self.fc(x), self.gelu))


class EncoderLayer(nn.Module):
    """Post-LN Transformer layer (Vaswani et al. 2017; modeling.py ``transformer_model``), or
    pre-LN with ``config.pre_ln`` (Xiong et al. 2020).

    With ``rows`` everything after the attention (projection, residuals, LayerNorms, FFN) is
    position-wise, so it runs only at those rows: [B, T, H] in, [R, H] out."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attn = SelfAttention(config)
        self.ln_attn = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ln_ffn = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.drop = Dropout(config.dropout)
        self.pre_ln = config.pre_ln

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rows: torch.Tensor | None = None) -> torch.Tensor:
        attn = self.attn(self.ln_attn(x) if self.pre_ln else x, mask, rows)
        if rows is not None:
            x = x.reshape(-1, x.size(-1)).index_select(0, rows)
        if self.pre_ln:
            x = x + self.drop(attn)
            return x + self.drop(self.ffn(self.ln_ffn(x)))
        x = self.ln_attn(x + self.drop(attn))
        x = self.ln_ffn(x + self.drop(self.ffn(x)))
        return x


class BertModel(nn.Module):
    """The encoder: ``forward -> (sequence_output [B, T, H], pooled_output [B, H])``.

    ``rows``: optional 1-D flat indices into B*T (``b * T + t``) of the only positions the
    caller will read. The last layer's position-wise part then runs at those rows and the
    [CLS] rows only, and sequence_output is [len(rows), H]. The result at those rows is exactly
    the full computation's (keys and values still come from every position); pre-training
    passes the masked positions, classification an empty tensor (it reads [CLS] only).
    ``pool_cls=False`` skips the pooler (pooled_output None): a caller that pools another
    vector calls :meth:`pool` itself.
    """

    def __init__(self, config: BertConfig, pooler: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        # ELECTRA's embeddings_project (modeling.py): embeddings narrower than the encoder
        self.embeddings_project = (
            nn.Linear(config.embedding_dim, config.hidden_size) if config.embedding_dim != config.hidden_size else None
        )
        self.layers = nn.ModuleList([EncoderLayer(config) for _ in range(config.num_layers)])
        # pre-LN: the residual stream is normalised once more after the last layer
        self.ln_final = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_ln else None
        # pooler=False (ELECTRA's generator): no [CLS] head, pooled_output is None
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if pooler else None
        # ELECTRA's classification head drops out [CLS] before its dense layer (HF ElectraClassificationHead)
        self.pooler_drop = Dropout(config.dropout) if config.pooler_activation == "gelu" else None
        self.apply(lambda m: init_weights(m, config.initializer_range))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
        *,
        padded: bool | None = None,
        pool_cls: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = input_ids.shape
        if T > self.config.max_position:
            raise BertraceError(
                f"model: sequence length {T} exceeds max_position {self.config.max_position}; "
                f"shorten the examples (examples.max_seq_len) or raise model.max_position"
            )
        if rows is not None and rows.dim() != 1:
            raise BertraceError(
                f"model: rows / masked_positions must be 1-D flat indices into B*T, got shape "
                f"{tuple(rows.shape)}; use b * T + t"
            )
        mask = padding_mask(attention_mask, padded)
        x = self.embeddings(input_ids, token_type_ids)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        for layer in self.layers[:-1]:
            x = layer(x, mask)
        if rows is None:
            x = self.layers[-1](x, mask)
        else:
            cls_rows = torch.arange(B, device=rows.device) * T
            x = self.layers[-1](x, mask, torch.cat([rows, cls_rows]))
        if self.ln_final is not None:
            x = self.ln_final(x)
        seq, cls = (x, x[:, 0]) if rows is None else (x[: len(rows)], x[len(rows) :])
        if self.pooler is None or not pool_cls:
            return seq, None
        return seq, self.pool(cls)

    def pool(self, v: torch.Tensor) -> torch.Tensor:
        """The pooler on a [B, H] sentence vector: dense + tanh (modeling.py get_pooled_output), or
        ELECTRA's dropout, dense, GELU (erf, as HF's "gelu")."""
        if self.pooler_drop is not None:
            return F.gelu(self.pooler(self.pooler_drop(v)))
        return torch.tanh(self.pooler(v))


class PreTrainingOutput(NamedTuple):
    mlm_logits: torch.Tensor | None  # [N, V] at masked_positions, [B, T, V] when they are None; None with mlm_loss
    nsp_logits: torch.Tensor  # [B, 2]; class 0 = IsNext, 1 = NotNext
    mlm_loss: torch.Tensor | None = None  # the mean MLM cross entropy, when the labels were given (training)


class MLMHead(nn.Module):
    """run_pretraining.py ``get_masked_lm_output``: dense -> GELU -> LayerNorm -> tied decoder."""

    def __init__(self, config: BertConfig):
        super().__init__()
        # to the embedding width, whose table the decoder shares (ELECTRA's get_token_logits)
        self.dense = nn.Linear(config.hidden_size, config.embedding_dim)
        self.ln = nn.LayerNorm(config.embedding_dim, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.embedding_dim, config.vocab_size)  # weight tied by the owner
        self.gelu = config.gelu
        self.predicted = config.predicted_vocab_size

    def transform(self, h: torch.Tensor) -> torch.Tensor:
        return self.ln(gelu(self.dense(h), self.gelu))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.decoder(self.transform(h))
        if self.predicted != logits.size(-1):  # padded vocabulary: the padding ids are never predicted
            logits = logits[..., : self.predicted]
        return logits

    def loss(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mean cross entropy of the logits :meth:`forward` would give against ``labels``
        (-100: ignored), fused with the decoder (:func:`linear_cross_entropy`): no [N, V] logits."""
        x = self.transform(h).reshape(-1, self.dense.out_features)
        weight, bias = self.decoder.weight[: self.predicted], self.decoder.bias[: self.predicted]
        return linear_cross_entropy(x, weight, labels.reshape(-1), bias)


class BertForPreTraining(nn.Module):
    """BERT with the masked-LM and next-sentence-prediction heads."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.mlm = MLMHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2)
        self.mlm.apply(lambda m: init_weights(m, config.initializer_range))
        self.nsp.apply(lambda m: init_weights(m, config.initializer_range))
        # Weight tying (Press & Wolf 2017; modeling.py reuses embedding_table): one Parameter.
        self.mlm.decoder.weight = self.bert.embeddings.word.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        masked_positions: torch.Tensor | None = None,
        *,
        padded: bool | None = None,
        mlm_labels: torch.Tensor | None = None,
    ) -> PreTrainingOutput:
        """``masked_positions``: 1-D LongTensor of flat indices into B*T (row b, position t is
        ``b * T + t``), as Google's ``gather_indexes``; the MLM head (and the last layer's
        position-wise part, see BertModel) then runs on those rows only. ``padded``: whether
        any row is padded, if the caller knows (see :func:`~pipeline.models.primitives.padding_mask`). ``mlm_labels`` (training):
        the MLM loss is computed fused with the decoder (:meth:`MLMHead.loss`) and returned as
        ``mlm_loss`` instead of the logits."""
        x, pooled = self.bert(input_ids, token_type_ids, attention_mask, rows=masked_positions, padded=padded)
        if mlm_labels is not None:
            return PreTrainingOutput(None, self.nsp(pooled), self.mlm.loss(x, mlm_labels))
        return PreTrainingOutput(self.mlm(x), self.nsp(pooled))


def pretraining_loss(
    output: PreTrainingOutput, mlm_labels: torch.Tensor, nsp_labels: torch.Tensor, nsp_weight: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(total, mlm, nsp)`` cross entropies, total = mlm + nsp_weight * nsp (run_pretraining.py
    adds them: ``nsp_weight=1``; 0 is MLM only, as RoBERTa, with the NSP loss still reported).

    ``mlm_labels`` is [N] for gathered logits, or [B, T] with -100 at unmasked positions for
    full logits. Google's weighted mean over real predictions equals this plain mean.
    """
    if output.mlm_loss is not None:  # computed fused with the decoder (training)
        mlm = output.mlm_loss
    else:
        logits = output.mlm_logits
        mlm = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(), mlm_labels.reshape(-1).long(), ignore_index=-100
        )
    nsp = F.cross_entropy(output.nsp_logits.float(), nsp_labels.reshape(-1).long())
    return mlm + nsp_weight * nsp, mlm, nsp


def pretraining_correct(
    output: PreTrainingOutput, mlm_labels: torch.Tensor, nsp_labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mlm_correct, mlm_count, nsp_correct, nsp_count)`` as 0-d tensors (no device sync),
    to sum over batches for accuracy. MLM labels of -100 are not counted."""
    logits = output.mlm_logits
    labels = mlm_labels.reshape(-1).long()
    valid = labels != -100
    mlm_pred = logits.reshape(-1, logits.size(-1)).argmax(-1)
    mlm_correct = ((mlm_pred == labels) & valid).sum()
    nsp_labels = nsp_labels.reshape(-1).long()
    nsp_correct = (output.nsp_logits.argmax(-1) == nsp_labels).sum()
    return mlm_correct, valid.sum(), nsp_correct, torch.tensor(nsp_labels.numel(), device=nsp_labels.device)


class _EncoderWithHead(nn.Module):
    """BertModel + dropout + a Linear head of ``num_labels``; what the fine-tuning heads share."""

    def __init__(self, config: BertConfig, num_labels: int, classifier_dropout: float | None = None):
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config)
        self.drop = Dropout(config.dropout if classifier_dropout is None else classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config.initializer_range)

    def load_pretrained_encoder(self, pretraining_state_dict: dict, source: str = "checkpoint") -> None:
        """Load the encoder (``bert.*``) from a BertForPreTraining state dict; the MLM and NSP
        heads are dropped and the classifier keeps its fresh init. Prefixes added by
        torch.compile (``_orig_mod.``) and DDP (``module.``) are stripped."""
        sd = {strip_wrappers(k): v for k, v in pretraining_state_dict.items()}
        encoder = {k[len("bert.") :]: v for k, v in sd.items() if k.startswith("bert.")}
        if not encoder:
            raise BertraceError(f"{source}: no 'bert.*' weights found; is it a BertForPreTraining state dict?")
        load_strict(self.bert, encoder, source)


class BertForSequenceClassification(_EncoderWithHead):
    """BertModel -> pooler -> dropout -> Linear (run_classifier.py ``create_model``). The pooler
    reads the [CLS] vector, or with ``config.classifier_pooling: mean`` the mean of the last layer
    over the unpadded positions. ``forward -> logits [B, num_labels]``."""

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.config.classifier_pooling == "mean":
            seq, _ = self.bert(input_ids, token_type_ids, attention_mask, pool_cls=False)
            if attention_mask is None:
                mean = seq.mean(dim=1)
            else:
                keep = attention_mask.to(seq.dtype).unsqueeze(-1)  # [B, T, 1]
                mean = (seq * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)
            pooled = self.bert.pool(mean)
        else:
            no_rows = torch.zeros(0, dtype=torch.long, device=input_ids.device)  # only [CLS] is read
            _, pooled = self.bert(input_ids, token_type_ids, attention_mask, rows=no_rows)
        return self.classifier(self.drop(pooled))


class BertForTokenClassification(_EncoderWithHead):
    """BertModel -> dropout -> Linear at every position (transformers' BertForTokenClassification;
    BERT paper section 5.3 for NER). ``forward -> logits [B, T, num_labels]``. The encoder's
    pooler is kept (so a pre-training checkpoint loads strictly) but unused; the HF export drops it
    (transformers' class has none)."""

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        seq, _ = self.bert(input_ids, token_type_ids, attention_mask)
        return self.classifier(self.drop(seq))


# --------------------------------------------------------------------------------------------
# Optimizer groups, sizes, FLOPs


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: weights decay, biases and LayerNorm parameters do not (Google's
    optimization.py ``exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]``).
    Works on any module (ours or Hugging Face's); a tied Parameter appears once."""
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            if isinstance(module, nn.LayerNorm) or name.endswith("bias"):
                no_decay.append(p)
            else:
                decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def num_parameters(model: nn.Module) -> int:
    """Distinct parameters (the tied decoder weight counts once)."""
    return sum(p.numel() for p in model.parameters())


def flops_per_token(config: BertConfig, seq_len: int, mlm_fraction: float = 0.15) -> float:
    """Training FLOPs (forward + backward) per input token of BertForPreTraining, for MFU.

    A matmul with an (m, n) weight costs 2mn FLOPs per row forward and 4mn backward, so 6mn in
    all (Kaplan et al. 2020); attention scores QK^T and the weighted sum AV add 2 * 2*T*H per
    token and layer forward, 12*T*H with backward (PaLM, Chowdhery et al. 2022, appendix B).
    With f = ``mlm_fraction`` (masked positions / tokens) and r = min(1, f + 1/T) (the rows the
    last layer's position-wise part runs on: masked positions and [CLS], see BertModel):

        6 * (L * 3H^2 + (L - 1 + r) * (H^2 + 2HI))   q/k/v; attention output + FFN in, out
      + 12 * L * H * T                               attention over T positions
      + 6 * f * (H^2 + H*V)                          MLM transform + decoder, masked rows only
      + 6 * (H^2 + 2H) / T                           pooler + NSP, once per sequence

    Embedding lookups, biases, LayerNorm, softmax and GELU are left out (not matmuls); the test
    checks the sum against torch's FlopCounterMode. ``mlm_fraction=1.0`` gives the cost of a
    model that runs the last layer and the MLM head on every position, as Hugging Face's does.
    """
    L, H, I, V, T = config.num_layers, config.hidden_size, config.intermediate_size, config.vocab_size, seq_len
    f = mlm_fraction
    r = min(1.0, f + 1.0 / T)
    encoder = 6 * (L * 3 * H * H + (L - 1 + r) * (H * H + 2 * H * I))
    attention = 12 * L * H * T
    mlm = 6 * f * (H * H + H * V)
    pooler_nsp = 6 * (H * H + 2 * H) / T
    return float(encoder + attention + mlm + pooler_nsp)
