"""The objective interface: what a pre-training run optimises, separate from how it loops.

The trainer (``pipeline/pretrain/trainer.py``) owns the optimizer, schedule, budget, precision, DDP,
checkpoints and logging; an objective owns everything that depends on *what* is learnt:

* the model it trains (``build_model``) and its training FLOPs per token (for MFU);
* a batch → named scalar losses (``forward`` then ``losses``; ``losses()["loss"]`` is the one
  back-propagated, the others are logged beside it);
* validation: per-batch sums (``eval_sums``, all-reduced over ranks) → metrics (``eval_metrics``);
* which validation metric picks ``best.pt`` (``best_metric``, lower is better).

A new objective (ELECTRA's replaced-token detection, a causal LM, ...) is a subclass in its own
file under ``pipeline/pretrain/objectives/``, registered in ``OBJECTIVES`` (``__init__.py``); the
training loop does not change.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from pipeline.models.bert import BertConfig


class Objective:
    """Base class; see the module docstring. Subclasses set the class variables."""

    name: ClassVar[str]
    loss_names: ClassVar[tuple[str, ...]]  # keys of losses(), "loss" first: the training-curve columns
    val_names: ClassVar[tuple[str, ...]]  # keys of eval_metrics(): the validation-curve columns
    best_metric: ClassVar[str]  # a val_names entry, lower is better; checkpoints store best_<it>
    examples_mode: ClassVar[str] = "mlm_nsp"  # the examples.mode whose shards it reads (manifest "mode")

    @classmethod
    def from_config(cls, cfg) -> "Objective":
        """The objective as ``cfg`` (a PretrainConfig) configures it."""
        return cls()

    def model_config(self, config: BertConfig) -> BertConfig:
        """The encoder config this objective trains (and the checkpoint records) from the one
        ``pretrain.model`` gives; e.g. ELECTRA sets its classification head. Default: unchanged."""
        return config

    def build_model(self, config: BertConfig) -> torch.nn.Module:
        raise NotImplementedError

    def prepare(self, manifest: dict[str, Any], examples_dir) -> None:
        """Check the examples are of this objective's kind (``examples_mode``) before training, and
        read what it needs from them (e.g. ``clm``: bytes per token, the unigram baseline)."""
        from pipeline.core.errors import BertraceError

        mode = manifest.get("mode", "mlm_nsp")
        if mode != self.examples_mode:
            kind = {"causal": "packed causal-LM blocks", "mlm_nsp": "MLM/NSP examples"}.get(mode, mode)
            fix = "clm" if mode == "causal" else "one of the masked-LM objectives (mlm_nsp, mlm, electra)"
            raise BertraceError(
                f"params.yaml: pretrain.objective is {self.name!r}, which trains on examples.mode "
                f"{self.examples_mode}, but {examples_dir}/manifest.json holds {kind} (examples.mode: {mode}); "
                f"set examples.mode: {self.examples_mode} and rerun the examples stage, or set pretrain.objective: "
                f"{fix}"
            )

    def flops_per_token(self, config: BertConfig, manifest: dict[str, Any]) -> float:
        """Training FLOPs per input token (forward + backward) for MFU and ``train_flops``."""
        raise NotImplementedError

    def forward(self, model: torch.nn.Module, batch) -> Any:
        """Run ``model`` on a ``pipeline.pretrain.data.Batch`` (inside autocast)."""
        raise NotImplementedError

    def losses(self, out: Any, batch) -> dict[str, torch.Tensor]:
        """Scalar losses keyed by ``loss_names``, computed inside autocast."""
        raise NotImplementedError

    def eval_sums(self, out: Any, batch) -> torch.Tensor:
        """A float64 vector of sums over this batch (losses, correct, counts), outside autocast."""
        raise NotImplementedError

    def eval_metrics(self, sums: list[float]) -> dict[str, float]:
        """Validation metrics keyed by ``val_names`` from the sums over the whole split, all ranks."""
        raise NotImplementedError
