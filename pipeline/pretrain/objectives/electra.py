"""ELECTRA's training objective (Clark et al. 2020): ``loss = generator MLM + disc_weight *
discriminator``, on the network of :mod:`pipeline.models.electra` (generator, discriminator, sampler).

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
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from pydantic import Field

from pipeline.core.config import Float, Section
from pipeline.core.errors import BertraceError
from pipeline.models.bert import BertConfig
from pipeline.models.electra import ElectraForPreTraining, ElectraOutput, generator_config, uniform_noise
from pipeline.pretrain.objectives.base import Objective

_FRACTION = "a fraction of the discriminator's, e.g. 0.25"


class ElectraParams(Section):
    """``pretrain.electra`` in params.yaml (used by ``objective: electra`` only)."""

    SECTION = "pretrain.electra"

    # generator hidden size / the discriminator's (ELECTRA: 1/4; Figure 3)
    generator_size: Annotated[Float, Field(gt=0, le=1, description=_FRACTION)] = 0.25
    # generator layers / the discriminator's (ELECTRA: same depth)
    generator_layers: Annotated[Float, Field(gt=0, le=1, description=_FRACTION)] = 1.0
    # loss = generator MLM + disc_weight * discriminator (ELECTRA: 50)
    disc_weight: Annotated[Float, Field(gt=0, description="ELECTRA: 50")] = 50.0


def electra_losses(
    out: ElectraOutput, masked_lm_labels: torch.Tensor, attention_mask: torch.Tensor | None, disc_weight: float = 50.0
) -> dict[str, torch.Tensor]:
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
    val_names = (
        "val_loss",
        "val_gen_loss",
        "val_gen_acc",
        "val_disc_loss",
        "val_disc_acc",
        "val_disc_precision",
        "val_disc_recall",
        "val_replaced_fraction",
    )
    best_metric = "val_disc_loss"

    def __init__(self, params: ElectraParams | None = None, seed: int = 0, pooler_activation: str | None = None):
        self.params = params or ElectraParams()
        self.seed = int(seed)
        self.pooler_activation = pooler_activation

    @classmethod
    def from_config(cls, cfg) -> "ElectraPretraining":
        return cls(cfg.electra, seed=cfg.seed, pooler_activation=cfg.model.pooler_activation)

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
        disc = encoder(config, 1.0) + 6 * (config.hidden_size**2 + config.hidden_size)
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
        return model(
            batch.input_ids,
            batch.token_type_ids,
            batch.attention_mask,
            batch.masked_positions,
            batch.masked_lm_labels,
            noise,
            padded=batch.padded,
        )

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
        return torch.stack(
            [
                t.double()
                for t in (
                    F.cross_entropy(gen, labels, reduction="sum"),
                    (gen.argmax(-1) == labels).sum(),
                    torch.tensor(labels.numel(), device=device),
                    (bce * mask).sum(),
                    ((pred == actual) & mask).sum(),
                    mask.sum(),
                    (pred & actual).sum(),
                    pred.sum(),
                    actual.sum(),
                )
            ]
        )

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
