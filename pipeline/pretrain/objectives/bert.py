"""BERT's objectives: masked LM + next-sentence prediction (Devlin et al. 2018, section 3.1),
and the masked LM alone.

``mlm_nsp``: ``loss = mlm + nsp``, as Google's ``run_pretraining.py`` adds them. ``mlm``: the
masked LM alone, as RoBERTa (Liu et al. 2019) and the academic-budget recipes (Izsak et al.
2021; Geiping & Goldstein 2022); the model is the same BertForPreTraining, the NSP term enters
the loss with weight 0 (so its head and the pooler get exact-zero gradients and every parameter
stays in the graph, which DDP needs) and the NSP head is still measured. This replaces the
former ``pretrain.nsp_weight`` (1.0 / 0.0); ``mlm_nsp`` weights its NSP term by
``pretrain.mlm_nsp.nsp_weight`` (Google: 1). The MLM head runs on the masked positions only
(``gather_indexes``), so the MLM loss is the mean over predictions, which equals Google's
weighted mean.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from pydantic import Field

from pipeline.core.config import Float, Section
from pipeline.core.errors import BertraceError
from pipeline.models.bert import BertConfig, BertForPreTraining, PreTrainingOutput, flops_per_token, pretraining_loss
from pipeline.pretrain.objectives.base import Objective


class MlmNspParams(Section):
    """``pretrain.mlm_nsp`` in params.yaml (used by ``objective: mlm_nsp`` only)."""

    SECTION = "pretrain.mlm_nsp"

    # loss = mlm + nsp_weight * nsp (run_pretraining.py: 1). NSP is what trains the pooled [CLS] that
    # fine-tuning reads: weighted 0 (objective mlm) SST-2 lost 1.1 points and the frozen probe 8 (docs/results.md)
    nsp_weight: Annotated[
        Float, Field(gt=0, description="Google: 1; for the masked LM alone set pretrain.objective: mlm")
    ] = 1.0


class BertPretraining(Objective):
    """Masked LM + NSP on BertForPreTraining (``mlm_nsp``); ``best.pt`` is the lowest validation
    MLM loss."""

    name = "mlm_nsp"
    loss_names = ("loss", "mlm_loss", "nsp_loss")
    val_names = ("val_loss", "val_mlm_loss", "val_mlm_acc", "val_nsp_loss", "val_nsp_acc", "val_perplexity")
    best_metric = "val_mlm_loss"

    nsp_weight: float = 1.0  # the weight of the NSP term in the loss

    def __init__(self, nsp_weight: float | None = None):
        if nsp_weight is not None:
            self.nsp_weight = float(nsp_weight)

    @classmethod
    def from_config(cls, cfg) -> "BertPretraining":
        return cls(cfg.mlm_nsp.nsp_weight)

    def build_model(self, config: BertConfig) -> BertForPreTraining:
        return BertForPreTraining(config)

    def flops_per_token(self, config: BertConfig, manifest: dict[str, Any]) -> float:
        train = manifest["splits"]["train"]
        mean_len = train["tokens"] / max(train["rows"], 1)
        mlm_fraction = train.get("masked_fraction", manifest.get("masked_lm_prob", 0.15))
        return flops_per_token(config, int(round(mean_len)), mlm_fraction=mlm_fraction)

    def forward(self, model: torch.nn.Module, batch) -> PreTrainingOutput:
        # padded: decided on the host by the loader's collate (no GPU→CPU read of the mask)
        # training: the MLM loss fused with the decoder (no logits); evaluation: logits, for the accuracy
        labels = batch.masked_lm_labels if model.training and torch.is_grad_enabled() else None
        return model(
            batch.input_ids,
            batch.token_type_ids,
            batch.attention_mask,
            batch.masked_positions,
            padded=batch.padded,
            mlm_labels=labels,
        )

    def losses(self, out: PreTrainingOutput, batch) -> dict[str, torch.Tensor]:
        loss, mlm, nsp = pretraining_loss(out, batch.masked_lm_labels, batch.next_sentence_labels, self.nsp_weight)
        return {"loss": loss, "mlm_loss": mlm, "nsp_loss": nsp}

    def eval_sums(self, out: PreTrainingOutput, batch) -> torch.Tensor:
        # mlm loss sum, mlm correct, mlm count, nsp loss sum, nsp correct, nsp count
        mlm, nsp = out.mlm_logits.float(), out.nsp_logits.float()
        device = mlm.device
        return torch.stack(
            [
                t.double()
                for t in (
                    F.cross_entropy(mlm, batch.masked_lm_labels, reduction="sum"),
                    (mlm.argmax(-1) == batch.masked_lm_labels).sum(),
                    torch.tensor(batch.masked_lm_labels.numel(), device=device),
                    F.cross_entropy(nsp, batch.next_sentence_labels, reduction="sum"),
                    (nsp.argmax(-1) == batch.next_sentence_labels).sum(),
                    torch.tensor(batch.size, device=device),
                )
            ]
        )

    def eval_metrics(self, sums: list[float]) -> dict[str, float]:
        if sums[2] == 0:
            raise BertraceError("validation split produced no masked tokens; check data/examples/valid shards")
        mlm_loss, nsp_loss = sums[0] / sums[2], sums[3] / sums[5]
        return {
            "val_loss": mlm_loss + self.nsp_weight * nsp_loss,
            "val_mlm_loss": mlm_loss,
            "val_mlm_acc": sums[1] / sums[2],
            "val_nsp_loss": nsp_loss,
            "val_nsp_acc": sums[4] / sums[5],
            "val_perplexity": math.exp(min(mlm_loss, 700.0)),
        }


class MlmPretraining(BertPretraining):
    """The masked LM alone (``mlm``): BertPretraining with the NSP term weighted 0 (see the
    module docstring); ``val_loss`` is the MLM loss, NSP is reported but not trained."""

    name = "mlm"
    nsp_weight = 0.0

    @classmethod
    def from_config(cls, cfg) -> "MlmPretraining":
        return cls()
