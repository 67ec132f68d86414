"""Pre-training objectives, one class per file (see ``base.py`` for the interface).

``pretrain.objective`` in params.yaml names one of ``OBJECTIVES``.
"""

from __future__ import annotations

from pipeline.objectives.base import Objective
from pipeline.objectives.bert import BertPretraining, MlmNspParams, MlmPretraining
from pipeline.objectives.clm import CausalLM
from pipeline.objectives.electra import ElectraParams, ElectraPretraining

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
    "ElectraParams",
    "ElectraPretraining",
    "MlmNspParams",
    "MlmPretraining",
    "Objective",
    "make_objective",
]
