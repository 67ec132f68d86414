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

The training objective (losses, ``best.pt``) is :mod:`pipeline.pretrain.objectives.electra`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from pipeline.core.errors import BertraceError
from pipeline.models.bert import BertConfig, BertModel, MLMHead
from pipeline.models.primitives import gelu, init_weights


def generator_config(config: BertConfig, size: float = 0.25, layers: float = 1.0) -> BertConfig:
    """The generator's config from the discriminator's (``get_generator_config``): width
    ``size`` x hidden, ``layers`` x depth, 4x intermediate, hidden/64 heads; same embeddings."""
    hidden = int(round(config.hidden_size * size))
    depth = int(round(config.num_layers * layers))
    if hidden < 1 or depth < 1:
        raise BertraceError(
            f"params.yaml: pretrain.electra generator_size {size} / generator_layers {layers} give a "
            f"generator of {depth} layers x {hidden} hidden; raise them"
        )
    d = config.to_dict()
    d.update(
        hidden_size=hidden,
        num_layers=depth,
        intermediate_size=4 * hidden,
        num_heads=max(1, hidden // 64),
        embedding_size=config.embedding_dim,
        pooler_activation="tanh",
    )
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

    def generator_logits(
        self, input_ids, token_type_ids, attention_mask, masked_positions, *, padded: bool | None = None
    ) -> torch.Tensor:
        """The generator's MLM logits [N, V] at ``masked_positions`` (flat indices into B*T)."""
        h, _ = self.generator(input_ids, token_type_ids, attention_mask, rows=masked_positions, padded=padded)
        return self.gen_head(h)

    def discriminator_logits(
        self, input_ids, token_type_ids=None, attention_mask=None, *, padded: bool | None = None
    ) -> torch.Tensor:
        """Replaced-token logits [B, T] for ``input_ids``."""
        h, _ = self.bert(input_ids, token_type_ids, attention_mask, padded=padded)
        return self.disc_head(h)

    def forward(
        self,
        input_ids,
        token_type_ids,
        attention_mask,
        masked_positions,
        masked_lm_labels,
        noise: torch.Tensor,
        *,
        padded: bool | None = None,
    ) -> ElectraOutput:
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


FIXED_POINT = 2.0**40  # the CDF's resolution: probabilities are summed as integers of 2^-40


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
