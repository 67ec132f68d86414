"""Random weights (biases and LayerNorm too) for the faithfulness tests against transformers."""

from __future__ import annotations

import torch
import torch.nn as nn


def randomize(model: nn.Module, seed: int) -> None:
    """Every parameter random (biases and LayerNorm too, which init leaves at 0 / 1), large enough
    that GELU's tanh and erf forms differ: a swapped, untransposed or misnamed weight cannot hide."""
    g = torch.Generator().manual_seed(seed)
    ln_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.LayerNorm)}
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * noise if id(p) in ln_weights else 0.2 * noise)
