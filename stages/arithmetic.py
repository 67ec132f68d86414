"""The CPU kernel pins of params.yaml ``compute`` (pipeline/core/arithmetic.py), set in this process's
environment before torch loads, with MKL's vendor shim loaded (so AMD CPUs run MKL's AVX2 branch
too): ATen, MKL and oneDNN read them once, at their first kernel, so every stage that runs torch
imports this module first. A stage whose torch was already loaded
(an in-process call) is checked instead: :func:`pipeline.core.device.apply_arithmetic` fails there
when the pins did not take effect."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipeline.core.arithmetic import ComputeConfig, pin_process
from pipeline.core.errors import BertraceError
from stages.common import load_params

PARAMS_FILE = Path("params.yaml")


def compute_config(params_file: str | os.PathLike = PARAMS_FILE) -> ComputeConfig:
    """params.yaml's ``compute`` section, validated (one line naming ``compute.<key>`` when wrong)."""
    return ComputeConfig.from_params(load_params("compute", params_file))


def pin_cpu_arithmetic(params_file: str | os.PathLike = PARAMS_FILE) -> None:
    """Export the pins ``compute.kernels`` asks for and load MKL's vendor shim, if torch is not
    loaded yet. A params file that cannot be read is left to the stage's own parsing, which reports
    it in one line."""
    if "torch" in sys.modules:
        return
    try:
        cfg = compute_config(params_file)
    except BertraceError:
        return
    pin_process(cfg)


pin_cpu_arithmetic()
