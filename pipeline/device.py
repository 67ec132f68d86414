"""Where and how a model runs: device, precision, peak FLOP/s (MFU) and the determinism switch.

Shared by pre-training, fine-tuning and evaluation, so editing the pre-training loop does not
rerun the stages downstream of it.

Reproducibility (``pretrain.deterministic``, on by default). The switch calls
``torch.use_deterministic_algorithms(True)``: an op with only a nondeterministic kernel then
raises (the pretrain stage names the switch) instead of silently varying. On CUDA it also sets
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS's reductions,
https://docs.nvidia.com/cuda/cublas/#results-reproducibility) and turns cuDNN benchmarking off;
torch then takes its deterministic kernels for the index_select / index_add backward (the MLM
gather) and steers the scaled-dot-product-attention backward away from its nondeterministic
(atomic-add) kernels, at some cost in speed. Not yet exercised on a GPU in this repository: if
an op raises, ``deterministic: false`` runs it (not bit-reproducible). On the CPU it changes no
result (the kernels bertrace uses are deterministic; checked bit for bit against runs without
it) and costs nothing.

What stays nondeterministic, switch or not (https://pytorch.org/docs/stable/notes/randomness.html):

* a wall-clock budget (``pretrain.time_minutes``): the weights depend on the machine's speed;
* results differ across torch / CUDA / driver versions, CPU or GPU kinds, precisions
  (fp32 / bf16 / fp16, TF32) and DDP world sizes, and on the CPU across thread counts: intra-op
  reductions are split per thread, so ``num_threads`` (0 = torch's default, the number of cores)
  is part of the recipe; the provenance records the count used;
* timing columns (``seconds``, ``tokens_per_s``) of the loss curves, and which weights a
  ``snapshot_minutes`` snapshot or which rows a ``checkpoint_minutes`` checkpoint closes.
"""

from __future__ import annotations

import os

import torch

from pipeline.errors import BertraceError

CUBLAS_WORKSPACE = ":4096:8"


def resolve_device(name: str, param: str = "pretrain.device") -> torch.device:
    """``auto`` is cuda → mps → cpu; anything else must name a device torch can use (``param``
    is the params.yaml key the name came from, for the error message)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise BertraceError(f"params.yaml: {param} = {name!r} is not a device (auto, cpu, cuda, cuda:N, mps)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BertraceError(f"params.yaml: {param} asks for CUDA but torch sees no GPU; use device: auto")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise BertraceError(f"params.yaml: {param} asks for MPS but it is not available; use device: auto")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_precision(name: str, device: torch.device) -> tuple[torch.dtype | None, bool]:
    """``(autocast dtype or None for fp32, use a GradScaler)``."""
    if name == "auto":
        if device.type != "cuda":
            return None, False
        name = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if name == "fp32":
        return None, False
    if name == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise BertraceError("params.yaml: pretrain.precision = bf16, but this GPU lacks bf16; use auto or fp16")
        if device.type not in ("cuda", "cpu"):
            raise BertraceError(f"params.yaml: pretrain.precision = bf16 is not supported on {device.type}; use fp32")
        return torch.bfloat16, False
    if device.type != "cuda":
        raise BertraceError(f"params.yaml: pretrain.precision = fp16 needs a CUDA GPU (device is {device}); use auto")
    return torch.float16, True


def precision_name(autocast_dtype: torch.dtype | None) -> str:
    """fp32 | bf16 | fp16 for a :func:`resolve_precision` dtype."""
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[autocast_dtype]


# Dense peak FLOP/s per GPU for model-FLOPs utilisation (vendor datasheets, no sparsity).
PEAK_FLOPS = {"H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
              "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
              "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
              "L4": {"bf16": 121e12, "fp16": 121e12, "fp32": 30e12}}


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Dense peak FLOP/s of ``device`` at ``precision`` (fp32 | bf16 | fp16) from PEAK_FLOPS; None if unknown."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((p.get(precision) for key, p in PEAK_FLOPS.items() if key in name), None)


def mfu(flops_per_s: float, device: torch.device, precision: str, world: int = 1) -> float | None:
    """Model FLOPs utilisation (PaLM, Chowdhery et al. 2022, app. B) on a known GPU, else None."""
    peak = peak_flops(device, precision)
    return round(flops_per_s / (peak * world), 4) if peak else None


def set_deterministic(on: bool, device: torch.device) -> dict:
    """Apply ``pretrain.deterministic`` (see the module docstring) and return what the run used,
    for the provenance. Process-wide: call it before the first CUDA kernel (cuBLAS reads its
    workspace setting when it creates its handle) and undo it with :func:`restore_deterministic`.
    On the CPU it changes no result (the kernels bertrace uses are deterministic already; the
    switch only turns a future nondeterministic op into an error)."""
    if on and device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(bool(on))
    return {
        "deterministic": bool(on),
        "num_threads": torch.get_num_threads(),  # CPU reductions are split per thread
        **({"cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
           if on and device.type == "cuda" else {}),
    }


def restore_deterministic(enabled: bool) -> None:
    """Put ``torch.use_deterministic_algorithms`` back as it was before :func:`set_deterministic`."""
    torch.use_deterministic_algorithms(enabled)
