"""The pre-training objectives by name: ``pretrain.objective`` in params.yaml names one of
``OBJECTIVES`` (one class per file of this package; ``base.py`` is the interface)."""

from __future__ import annotations

from pipeline.pretrain.objectives.base import Objective
from pipeline.pretrain.objectives.bert import BertPretraining, MlmPretraining
from pipeline.pretrain.objectives.clm import CausalLM
from pipeline.pretrain.objectives.electra import ElectraPretraining

OBJECTIVES: dict[str, type[Objective]] = {
    "mlm_nsp": BertPretraining,
    "mlm": MlmPretraining,
    "electra": ElectraPretraining,
    "clm": CausalLM,
}


def make_objective(cfg) -> Objective:
    """The objective ``cfg.objective`` names, configured from ``cfg`` (a PretrainConfig)."""
    return OBJECTIVES[cfg.objective].from_config(cfg)


__all__ = [
    "OBJECTIVES",
    "BertPretraining",
    "CausalLM",
    "ElectraPretraining",
    "MlmPretraining",
    "Objective",
    "make_objective",
]
