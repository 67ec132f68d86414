"""ELECTRA's replaced-token detection (Clark et al. 2020, "Pre-training Text Encoders as
Discriminators Rather Than Generators"), as google-research/electra trains it.

A small masked-LM *generator* fills the masked positions of the example shards with tokens it
samples from its own softmax; the *discriminator* (the encoder that is kept and fine-tuned) then
labels every input position as original or replaced (section 2). Both train jointly::

    loss = generator MLM loss + disc_weight * discriminator loss       (disc_weight 50, eq. 1)

The choices below follow the released code (``configure_pretraining.py``, ``run_pretraining.py``,
``model/modeling.py``):

* generator: same depth as the discriminator (``generator_layers`` 1.0), hidden size
  ``generator_size`` (0.25) times the discriminator's, 4x intermediate, hidden/64 heads (at least
  one): ``get_generator_config``; 1/4-1/2 of the width works best (Figure 3);
* the token, position and segment embeddings and their LayerNorm are one module shared by both
  (the ``electra/embeddings`` scope both networks reuse); each network projects them to its own
  width when they differ (``embeddings_project``, ``pretrain.model.embedding_size``); the
  generator's output layer is the shared token embedding (``get_token_logits``);
* sampling: one draw per masked position from softmax(generator logits) (temperature 1), no
  gradient through it (``_get_fake_data``). The discriminator sees the original text with the
  samples at the masked positions (``unmask`` then ``scatter_update``); a sample equal to the
  original token is labelled *original*. Its loss is the sigmoid cross entropy averaged over the
  non-padding positions ([CLS] and [SEP] included), as ``_get_discriminator_output``.

Differences, deliberate: the masked positions are the example shards' (BERT's 80/10/10 recipe;
ELECTRA masks 85 % [MASK] / 15 % kept), so ``mlm_nsp``, ``mlm`` and ``electra`` train on the
same shards; and the draw is inverse-CDF sampling with two uniform numbers per masked position
(a block of the vocabulary, then a token in it: :func:`sample_tokens`) instead of
``sample_from_softmax``'s Gumbel noise over the whole vocabulary: a sample from the same softmax,
but 8,000x fewer random numbers (on the CPU, drawing Gumbel or exponential noise for every
(position, token) cost more than the rest of the ELECTRA step's extra work). The CDFs are summed
in 2^-40 fixed point (int64), because a floating-point cumsum has no deterministic CUDA kernel.
During training the uniforms come from
torch's global generator, seeded by ``pretrain.seed`` and saved in ``last.pt`` with the other RNG
states, so a resumed run draws what an uninterrupted one draws; validation draws from a
generator seeded by ``pretrain.seed`` and the batch's ids, so each evaluation sees the same
replacements and never disturbs the training stream.

The checkpoint keeps the discriminator encoder under ``bert.*`` (fine-tuning loads it unchanged,
with ELECTRA's classification head: ``pooler_activation: gelu``), its head under ``disc_head.*``
and the generator under ``generator.*`` / ``gen_head.*``. The discriminator's pooler is not used
in pre-training (ELECTRA has none; it becomes the fine-tuning head's dense layer, freshly
initialised in HF's ElectraForSequenceClassification too) and is frozen so DDP sees no unused
parameter. ``best.pt`` is the lowest validation discriminator loss, not the total: the
discriminator is what is kept and fine-tuned; the total is dominated (50x) by it anyway, and its
generator part would only blur the choice (a better generator makes the discriminator's task
harder, so the two losses do not fall together).
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from pydantic import field_validator

from pipeline.config import Float, Section
from pipeline.errors import BertraceError
from pipeline.model import BertConfig, BertModel, MLMHead, gelu, init_weights
from pipeline.objectives.base import Objective


class ElectraParams(Section):
    """``pretrain.electra`` in params.yaml (used by ``objective: electra`` only)."""

    SECTION = "pretrain.electra"

    generator_size: Float = 0.25  # generator hidden size / the discriminator's (ELECTRA: 1/4; Figure 3)
    generator_layers: Float = 1.0  # generator layers / the discriminator's (ELECTRA: same depth)
    disc_weight: Float = 50.0  # loss = generator MLM + disc_weight * discriminator (ELECTRA: 50)

    @field_validator("generator_size", "generator_layers")
    @classmethod
    def _fraction(cls, v: float) -> float:
        if not 0 < v <= 1:
            raise ValueError("must be a fraction of the discriminator's in (0, 1], e.g. 0.25")
        return v

    @field_validator("disc_weight")
    @classmethod
    def _weight(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be > 0 (ELECTRA: 50)")
        return v


def generator_config(config: BertConfig, size: float = 0.25, layers: float = 1.0) -> BertConfig:
    """The generator's config from the discriminator's (``get_generator_config``): width
    ``size`` x hidden, ``layers`` x depth, 4x intermediate, hidden/64 heads; same embeddings."""
    hidden = int(round(config.hidden_size * size))
    depth = int(round(config.num_layers * layers))
    if hidden < 1 or depth < 1:
        raise BertraceError(f"params.yaml: pretrain.electra generator_size {size} / generator_layers {layers} give a "
                            f"generator of {depth} layers x {hidden} hidden; raise them")
    d = config.to_dict()
    d.update(hidden_size=hidden, num_layers=depth, intermediate_size=4 * hidden, num_heads=max(1, hidden // 64),
             embedding_size=config.embedding_dim, pooler_activation="tanh")
    return BertConfig.from_dict(d)


class DiscriminatorHead(nn.Module):
    """dense -> activation -> dense(1) per position (``_get_discriminator_output``; HF
    ElectraDiscriminatorPredictions)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.prediction = nn.Linear(config.hidden_size, 1)
        self.gelu = config.gelu

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.prediction(gelu(self.dense(h), self.gelu)).squeeze(-1)


class ElectraOutput(NamedTuple):
    gen_logits: torch.Tensor  # [N, V] at the masked positions
    disc_logits: torch.Tensor  # [B, T]: > 0 says "replaced"
    disc_labels: torch.Tensor  # [B, T] float: 1 where the input differs from the original
    sampled: torch.Tensor  # [N] the generator's samples


class ElectraForPreTraining(nn.Module):
    """Generator + discriminator with shared embeddings; see the module docstring."""

    def __init__(self, config: BertConfig, gen_config: BertConfig):
        super().__init__()
        if gen_config.embedding_dim != config.embedding_dim or gen_config.vocab_size != config.vocab_size:
            raise BertraceError("ELECTRA: the generator must have the discriminator's embedding size and vocabulary")
        self.config, self.gen_config = config, gen_config
        self.bert = BertModel(config)  # the discriminator
        self.bert.pooler.requires_grad_(False)  # fine-tuning's head; nothing trains it here
        self.disc_head = DiscriminatorHead(config)
        self.generator = BertModel(gen_config, pooler=False)
        # one embedding module for both networks, owned (and saved) by the discriminator
        del self.generator.embeddings
        object.__setattr__(self.generator, "embeddings", self.bert.embeddings)
        self.gen_head = MLMHead(gen_config)
        for m in (self.disc_head, self.gen_head):
            m.apply(lambda mod: init_weights(mod, config.initializer_range))
        self.gen_head.decoder.weight = self.bert.embeddings.word.weight  # tied, as get_token_logits

    def generator_logits(self, input_ids, token_type_ids, attention_mask, masked_positions, *,
                         padded: bool | None = None) -> torch.Tensor:
        """The generator's MLM logits [N, V] at ``masked_positions`` (flat indices into B*T)."""
        h, _ = self.generator(input_ids, token_type_ids, attention_mask, rows=masked_positions, padded=padded)
        return self.gen_head(h)

    def discriminator_logits(self, input_ids, token_type_ids=None, attention_mask=None, *,
                             padded: bool | None = None) -> torch.Tensor:
        """Replaced-token logits [B, T] for ``input_ids``."""
        h, _ = self.bert(input_ids, token_type_ids, attention_mask, padded=padded)
        return self.disc_head(h)

    def forward(self, input_ids, token_type_ids, attention_mask, masked_positions, masked_lm_labels,
                noise: torch.Tensor, *, padded: bool | None = None) -> ElectraOutput:
        """``noise``: [N, 2] uniform numbers in [0, 1) (see :func:`uniform_noise`), two per masked
        position, turned into samples of softmax(generator logits) by :func:`sample_tokens`."""
        gen_logits = self.generator_logits(input_ids, token_type_ids, attention_mask, masked_positions, padded=padded)
        with torch.no_grad():
            sampled = sample_tokens(F.softmax(gen_logits.detach().float(), dim=-1), noise)
            original = masked_lm_labels.reshape(-1).to(sampled.dtype)
            flat = input_ids.reshape(-1).clone()
            flat[masked_positions] = original  # unmask: the original text ...
            labels = torch.zeros_like(flat, dtype=torch.float32)
            labels[masked_positions] = (sampled != original).float()  # ... a sample equal to it is "original"
            flat[masked_positions] = sampled  # ... with the samples at the masked positions
            corrupted = flat.view_as(input_ids)
        disc_logits = self.discriminator_logits(corrupted, token_type_ids, attention_mask, padded=padded)
        return ElectraOutput(gen_logits, disc_logits, labels.view_as(input_ids), sampled)


FIXED_POINT = 2.0 ** 40  # the CDF's resolution: probabilities are summed as integers of 2^-40


BLOCK = 128  # vocabulary ids per block of the two-level sampler


def uniform_noise(rows: int, device: torch.device | str, generator: torch.Generator | None = None) -> torch.Tensor:
    """[rows, 2] float64 uniform numbers in [0, 1) from ``generator`` (None: torch's global one):
    per masked position, one picks a block of the vocabulary and one a token in it."""
    return torch.rand(rows, 2, device=device, dtype=torch.float64, generator=generator)


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of int64 ``weights`` [N, K], the first index whose cumulative weight exceeds ``u``
    [N] times the row's total."""
    cdf = weights.cumsum(-1)
    target = (u * cdf[:, -1].to(torch.float64)).to(torch.int64).clamp_min(0)
    return torch.searchsorted(cdf, target[:, None], right=True).squeeze(-1).clamp_max(weights.size(-1) - 1)


def sample_tokens(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` [N, V] (need not be normalised) with ``u`` [N, 2] uniforms:
    inverse-CDF sampling in two levels, a block of ``BLOCK`` ids by the blocks' sums, then an id
    in it, so only [N, V / BLOCK] and [N, BLOCK] cumulative sums are formed (a cumsum over the
    whole vocabulary is a slow sequential scan on the CPU). Weights are ``ceil(p * 2^40)`` in
    int64: exact integer sums, deterministic on every device (a float cumsum has no deterministic
    CUDA kernel); every id with p > 0 can be drawn, at p rounded up to a multiple of 2^-40."""
    N, V = probs.shape
    nb = -(-V // BLOCK)
    blocks = F.pad(probs, (0, nb * BLOCK - V)) if nb * BLOCK != V else probs
    blocks = blocks.reshape(N, nb, BLOCK)
    block = _inverse_cdf((blocks.sum(-1, dtype=torch.float64) * FIXED_POINT).ceil().to(torch.int64), u[:, 0])
    inner = blocks[torch.arange(N, device=probs.device), block].to(torch.float64)
    token = _inverse_cdf((inner * FIXED_POINT).ceil().to(torch.int64), u[:, 1])
    return (block * BLOCK + token).clamp_max(V - 1)


def electra_losses(out: ElectraOutput, masked_lm_labels: torch.Tensor, attention_mask: torch.Tensor | None,
                   disc_weight: float = 50.0) -> dict[str, torch.Tensor]:
    """``{loss, gen_loss, disc_loss}``: generator cross entropy over the masked positions, the
    discriminator's sigmoid cross entropy averaged over the non-padding positions."""
    gen = F.cross_entropy(out.gen_logits.float(), masked_lm_labels.reshape(-1).long())
    per_token = F.binary_cross_entropy_with_logits(out.disc_logits.float(), out.disc_labels, reduction="none")
    if attention_mask is None:
        disc = per_token.mean()
    else:
        weights = attention_mask.to(per_token.dtype)
        disc = (per_token * weights).sum() / weights.sum().clamp_min(1.0)
    return {"loss": gen + disc_weight * disc, "gen_loss": gen, "disc_loss": disc}


class ElectraPretraining(Objective):
    """Replaced-token detection; ``best.pt`` is the lowest validation discriminator loss."""

    name = "electra"
    loss_names = ("loss", "gen_loss", "disc_loss", "replaced_fraction")
    val_names = ("val_loss", "val_gen_loss", "val_gen_acc", "val_disc_loss", "val_disc_acc", "val_disc_precision",
                 "val_disc_recall", "val_replaced_fraction")
    best_metric = "val_disc_loss"

    def __init__(self, params: ElectraParams | None = None, seed: int = 0, pooler_activation: str | None = None):
        self.params = params or ElectraParams()
        self.seed = int(seed)
        self.pooler_activation = pooler_activation

    @classmethod
    def from_config(cls, cfg) -> "ElectraPretraining":
        model = dict(cfg.model)
        return cls(cfg.electra, seed=cfg.seed, pooler_activation=model.get("pooler_activation"))

    def model_config(self, config: BertConfig) -> BertConfig:
        """ELECTRA's classification head for the discriminator, unless the params chose one."""
        if self.pooler_activation is None and config.pooler_activation != "gelu":
            d = config.to_dict()
            d["pooler_activation"] = "gelu"
            return BertConfig.from_dict(d)
        return config

    def gen_config(self, config: BertConfig) -> BertConfig:
        return generator_config(config, self.params.generator_size, self.params.generator_layers)

    def build_model(self, config: BertConfig) -> ElectraForPreTraining:
        return ElectraForPreTraining(config, self.gen_config(config))

    def flops_per_token(self, config: BertConfig, manifest: dict[str, Any]) -> float:
        """Generator (6 x its matmul weights on every position, attention, the MLM head on the
        masked rows) + discriminator (every position, its head) per token, forward + backward."""
        train = manifest["splits"]["train"]
        T = max(int(round(train["tokens"] / max(train["rows"], 1))), 1)
        f = train.get("masked_fraction", manifest.get("masked_lm_prob", 0.15))

        def encoder(c: BertConfig, r: float) -> float:
            L, H, I = c.num_layers, c.hidden_size, c.intermediate_size
            proj = 6 * c.embedding_dim * H if c.embedding_dim != H else 0
            return proj + 6 * (L * 3 * H * H + (L - 1 + r) * (H * H + 2 * H * I)) + 12 * L * H * T

        g = self.gen_config(config)
        E, V = config.embedding_dim, config.vocab_size
        gen = encoder(g, min(1.0, f)) + 6 * f * (g.hidden_size * E + E * V)
        disc = encoder(config, 1.0) + 6 * (config.hidden_size ** 2 + config.hidden_size)
        return float(gen + disc)

    def _noise(self, model: ElectraForPreTraining, batch) -> torch.Tensor:
        rows = batch.masked_positions.numel()
        device = batch.input_ids.device
        if model.training:
            return uniform_noise(rows, device)  # the global generator: saved in last.pt
        # validation: the same draws at every evaluation, whatever the training stream did
        head = batch.input_ids[:, :16].reshape(-1).tolist() + [batch.input_ids.size(0), batch.input_ids.size(1)]
        digest = hashlib.sha256(repr((self.seed, head)).encode()).digest()
        g = torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        return uniform_noise(rows, device, generator=g)

    def forward(self, model: torch.nn.Module, batch) -> ElectraOutput:
        noise = self._noise(model, batch)
        return model(batch.input_ids, batch.token_type_ids, batch.attention_mask, batch.masked_positions,
                     batch.masked_lm_labels, noise, padded=batch.padded)

    def losses(self, out: ElectraOutput, batch) -> dict[str, torch.Tensor]:
        losses = electra_losses(out, batch.masked_lm_labels, batch.attention_mask, self.params.disc_weight)
        replaced = out.disc_labels.sum() / batch.attention_mask.sum().clamp_min(1)
        return {**losses, "replaced_fraction": replaced.detach()}

    def eval_sums(self, out: ElectraOutput, batch) -> torch.Tensor:
        # gen loss sum, gen correct, masked count, disc loss sum, disc correct, tokens,
        # true positives, predicted replaced, actually replaced
        gen = out.gen_logits.float()
        labels = batch.masked_lm_labels.reshape(-1).long()
        mask = batch.attention_mask.bool()
        disc = out.disc_logits.float()
        actual = out.disc_labels.bool() & mask
        pred = (disc > 0) & mask
        bce = F.binary_cross_entropy_with_logits(disc, out.disc_labels, reduction="none")
        device = gen.device
        return torch.stack([t.double() for t in (
            F.cross_entropy(gen, labels, reduction="sum"),
            (gen.argmax(-1) == labels).sum(),
            torch.tensor(labels.numel(), device=device),
            (bce * mask).sum(),
            ((pred == actual) & mask).sum(),
            mask.sum(),
            (pred & actual).sum(),
            pred.sum(),
            actual.sum(),
        )])

    def eval_metrics(self, sums: list[float]) -> dict[str, float]:
        if sums[2] == 0 or sums[5] == 0:
            raise BertraceError("validation split produced no masked tokens; check data/examples/valid shards")
        gen_loss, disc_loss = sums[0] / sums[2], sums[3] / sums[5]
        return {
            "val_loss": gen_loss + self.params.disc_weight * disc_loss,
            "val_gen_loss": gen_loss,
            "val_gen_acc": sums[1] / sums[2],
            "val_disc_loss": disc_loss,
            "val_disc_acc": sums[4] / sums[5],
            "val_disc_precision": sums[6] / sums[7] if sums[7] else 0.0,
            "val_disc_recall": sums[6] / sums[8] if sums[8] else 0.0,
            "val_replaced_fraction": sums[8] / sums[5],
        }

