"""Pre-training objectives, one class per file (see ``base.py`` for the interface).

``pretrain.objective`` in params.yaml names one of ``OBJECTIVES``.
"""

from __future__ import annotations

from pipeline.objectives.base import Objective
from pipeline.objectives.bert import BertPretraining

OBJECTIVES: dict[str, type[Objective]] = {"bert": BertPretraining}


def make_objective(cfg) -> Objective:
    """The objective ``cfg.objective`` names, configured from ``cfg`` (a PretrainConfig)."""
    return OBJECTIVES[cfg.objective].from_config(cfg)


__all__ = ["OBJECTIVES", "BertPretraining", "Objective", "make_objective"]
