"""Causal language modelling (``pretrain.objective: clm``): next-token prediction with a GPT-2
style decoder (Radford et al. 2019; :mod:`pipeline.models.gpt`) on packed blocks (``examples.mode: causal``,
:mod:`pipeline.data.packing`).

The loss is the mean cross entropy of every position's prediction of the next token of its block
(``T - 1`` targets per block of ``T``; :func:`pipeline.models.gpt.causal_lm_loss`), in nats per token.
Validation reports, besides it (``val_loss``, the ``best.pt`` metric):

* ``val_perplexity`` = ``exp(val_loss)``;
* ``val_bits_per_byte`` = ``val_loss / ln 2 / bytes_per_token``, with the validation split's
  UTF-8 bytes per token from the manifest (:mod:`pipeline.data.packing`): a number that compares
  across tokenizers (and with published byte-level results);
* ``val_next_token_acc``: top-1 next-token accuracy;
* the unigram baseline: the cross entropy, on exactly the same targets, of the training split's
  token frequencies (add-one smoothed; ``unigram_counts.npy``) as ``val_unigram_loss`` and
  ``val_unigram_bits_per_byte``: what a model that ignores the context would score, so that
  ``val_loss`` below it is what the decoder learnt from context.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.core.errors import BertraceError
from pipeline.core.formats import UNIGRAM_COUNTS
from pipeline.models.bert import BertConfig
from pipeline.models.gpt import GPT, GPTOutput, decoder_flops_per_token
from pipeline.pretrain.objectives.base import Objective


class CausalLM(Objective):
    """Next-token prediction on :class:`pipeline.models.gpt.GPT`; ``best.pt`` is the lowest validation loss."""

    name = "clm"
    examples_mode = "causal"
    loss_names = ("loss",)
    val_names = (
        "val_loss",
        "val_perplexity",
        "val_bits_per_byte",
        "val_next_token_acc",
        "val_unigram_loss",
        "val_unigram_bits_per_byte",
    )
    best_metric = "val_loss"

    def __init__(self):
        self.bytes_per_token: float | None = None  # of the validation split, set by prepare()
        self.unigram: torch.Tensor | None = None  # log p(id) of the training split's unigram model

    def prepare(self, manifest: dict[str, Any], examples_dir) -> None:
        super().prepare(manifest, examples_dir)
        valid = manifest["splits"].get("valid") or {}
        bpt = valid.get("bytes_per_token")
        if not bpt or bpt <= 0:
            raise BertraceError(
                f"{Path(examples_dir) / 'manifest.json'}: no bytes_per_token for the valid split; "
                "rerun the examples stage (dvc repro examples)"
            )
        self.bytes_per_token = float(bpt)
        self.unigram = torch.from_numpy(unigram_log_probs(manifest, examples_dir))

    def build_model(self, config: BertConfig) -> GPT:
        return GPT(config)

    def flops_per_token(self, config: BertConfig, manifest: dict[str, Any]) -> float:
        return decoder_flops_per_token(config, int(manifest["max_seq_len"]))

    def forward(self, model: torch.nn.Module, batch) -> GPTOutput:
        """The logits of every position but each block's last (which has no next token), as
        ``[B * (T - 1), V]`` rows (``GPT.forward(rows=...)``): the LM head, by far the largest
        matmul of a small model with a 16k vocabulary, skips the last position, and the logits come
        out contiguous, in target order, so the loss needs no slice (whose backward would write a
        zero-filled ``[B, T, V]`` gradient) and no copy. Blocks are never padded: no attention mask.
        While training (autograd on) the model also gets the targets and returns the loss from
        the fused head + cross entropy (:func:`pipeline.models.gpt.linear_cross_entropy`), no logits."""
        B, T = batch.input_ids.shape
        return model(batch.input_ids, rows=_prediction_rows(B, T, batch.input_ids.device), targets=self.targets(batch))

    @staticmethod
    def targets(batch) -> torch.Tensor:
        """The next token of every predicting position, flat in the order of :meth:`forward`'s rows."""
        return batch.input_ids[:, 1:].reshape(-1)

    def losses(self, out: GPTOutput, batch) -> dict[str, torch.Tensor]:
        # = pipeline.models.gpt.causal_lm_loss(model(input_ids).logits, input_ids) (tests/unit/pretrain/test_clm.py)
        return {"loss": out.loss if out.loss is not None else F.cross_entropy(out.logits.float(), self.targets(batch))}

    def eval_sums(self, out: GPTOutput, batch) -> torch.Tensor:
        # loss sum (nats), correct, targets, unigram loss sum (nats)
        logits, targets = out.logits.float(), self.targets(batch)
        return torch.stack(
            [
                t.double()
                for t in (
                    F.cross_entropy(logits, targets, reduction="sum"),
                    (logits.argmax(-1) == targets).sum(),
                    torch.tensor(targets.numel(), device=logits.device),
                    self.unigram_nats(targets),
                )
            ]
        )

    def unigram_nats(self, targets: torch.Tensor) -> torch.Tensor:
        """Sum over ``targets`` of ``-log p_unigram(target)`` (0 when :meth:`prepare` was not called)."""
        if self.unigram is None:
            return torch.zeros((), dtype=torch.float64, device=targets.device)
        if self.unigram.device != targets.device:  # float64, except on MPS (which has none)
            dtype = torch.float32 if targets.device.type == "mps" else torch.float64
            self.unigram = self.unigram.to(targets.device, dtype)
        return -self.unigram[targets.reshape(-1)].sum()

    def eval_metrics(self, sums: list[float]) -> dict[str, float]:
        if sums[2] == 0:
            raise BertraceError("validation split produced no next-token targets; check data/examples/valid shards")
        loss, unigram = sums[0] / sums[2], sums[3] / sums[2]
        bits = 1.0 / math.log(2) / (self.bytes_per_token or float("nan"))
        return {
            "val_loss": loss,
            "val_perplexity": math.exp(min(loss, 700.0)),
            "val_bits_per_byte": loss * bits,
            "val_next_token_acc": sums[1] / sums[2],
            "val_unigram_loss": unigram if self.unigram is not None else float("nan"),
            "val_unigram_bits_per_byte": unigram * bits if self.unigram is not None else float("nan"),
        }


_ROWS: dict[tuple, torch.Tensor] = {}


def _prediction_rows(B: int, T: int, device: torch.device) -> torch.Tensor:
    """Flat indices ``b * T + t`` for ``t < T - 1`` (cached per shape and device)."""
    key = (B, T, str(device))
    if key not in _ROWS:
        _ROWS[key] = (torch.arange(B)[:, None] * T + torch.arange(T - 1)[None, :]).reshape(-1).to(device)
    return _ROWS[key]


def unigram_log_probs(manifest: dict[str, Any], examples_dir) -> np.ndarray:
    """``log p(id)`` of the training split's add-one-smoothed unigram model, from the counts the
    examples stage wrote beside its manifest (checked against the manifest's sha256)."""
    from pipeline.core.io import sha256_file

    info = manifest.get("unigram") or {}
    path = Path(examples_dir) / info.get("path", UNIGRAM_COUNTS)
    if not path.is_file():
        raise BertraceError(
            f"{path}: the training split's unigram counts are missing; rerun the examples stage (dvc repro examples)"
        )
    if info.get("sha256") and sha256_file(path) != info["sha256"]:
        raise BertraceError(
            f"{path}: sha256 differs from {Path(examples_dir) / 'manifest.json'}; rerun the "
            "examples stage (dvc repro examples)"
        )
    counts = np.load(path, allow_pickle=False).astype(np.float64)
    return np.log((counts + 1.0) / (counts.sum() + len(counts)))


__all__ = ["CausalLM"]
