"""BERT's objective: masked LM + next-sentence prediction (Devlin et al. 2018, section 3.1).

``loss = mlm + nsp_weight * nsp``, as Google's ``run_pretraining.py`` adds them (``nsp_weight``
1.0); 0.0 trains the MLM alone, as RoBERTa (Liu et al. 2019), and still measures the NSP head.
The MLM head runs on the masked positions only (``gather_indexes``), so the MLM loss is the
mean over predictions, which equals Google's weighted mean.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.errors import BertraceError
from pipeline.model import BertConfig, BertForPreTraining, PreTrainingOutput, flops_per_token, pretraining_loss
from pipeline.objectives.base import Objective


class BertPretraining(Objective):
    """Masked LM + NSP on BertForPreTraining; ``best.pt`` is the lowest validation MLM loss."""

    name = "bert"
    loss_names = ("loss", "mlm_loss", "nsp_loss")
    val_names = ("val_loss", "val_mlm_loss", "val_mlm_acc", "val_nsp_loss", "val_nsp_acc", "val_perplexity")
    best_metric = "val_mlm_loss"

    def __init__(self, nsp_weight: float = 1.0):
        self.nsp_weight = nsp_weight

    @classmethod
    def from_config(cls, cfg) -> "BertPretraining":
        return cls(nsp_weight=cfg.nsp_weight)

    def build_model(self, config: BertConfig) -> BertForPreTraining:
        return BertForPreTraining(config)

    def flops_per_token(self, config: BertConfig, manifest: dict[str, Any]) -> float:
        train = manifest["splits"]["train"]
        mean_len = train["tokens"] / max(train["rows"], 1)
        mlm_fraction = train.get("masked_fraction", manifest.get("masked_lm_prob", 0.15))
        return flops_per_token(config, int(round(mean_len)), mlm_fraction=mlm_fraction)

    def forward(self, model: torch.nn.Module, batch) -> PreTrainingOutput:
        # padded: decided on the host by the loader's collate (no GPU→CPU read of the mask)
        return model(batch.input_ids, batch.token_type_ids, batch.attention_mask, batch.masked_positions,
                     padded=batch.padded)

    def losses(self, out: PreTrainingOutput, batch) -> dict[str, torch.Tensor]:
        loss, mlm, nsp = pretraining_loss(out, batch.masked_lm_labels, batch.next_sentence_labels, self.nsp_weight)
        return {"loss": loss, "mlm_loss": mlm, "nsp_loss": nsp}

    def eval_sums(self, out: PreTrainingOutput, batch) -> torch.Tensor:
        # mlm loss sum, mlm correct, mlm count, nsp loss sum, nsp correct, nsp count
        mlm, nsp = out.mlm_logits.float(), out.nsp_logits.float()
        device = mlm.device
        return torch.stack([t.double() for t in (
            F.cross_entropy(mlm, batch.masked_lm_labels, reduction="sum"),
            (mlm.argmax(-1) == batch.masked_lm_labels).sum(),
            torch.tensor(batch.masked_lm_labels.numel(), device=device),
            F.cross_entropy(nsp, batch.next_sentence_labels, reduction="sum"),
            (nsp.argmax(-1) == batch.next_sentence_labels).sum(),
            torch.tensor(batch.size, device=device),
        )])

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
