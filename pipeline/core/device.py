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
(atomic-add) kernels, at some cost in speed. Not yet exercised on a GPU in this repository
(``bench/gpu_check.sh`` checks it): if an op raises, ``deterministic: false`` runs it (not
bit-reproducible: the index_select and memory-efficient attention backward then add with
atomics, so even a resumed run differs from an uninterrupted one in the last bits). On the CPU it changes no
result (the kernels bertrace uses are deterministic; checked bit for bit against runs without
it) and costs nothing.

What stays nondeterministic, switch or not (https://pytorch.org/docs/stable/notes/randomness.html):

* a wall-clock budget (``pretrain.time_minutes``): the weights depend on the machine's speed;
* results differ across torch / CUDA / driver versions, CPU or GPU kinds, precisions
  (fp32 / bf16 / fp16, TF32) and DDP world sizes, and on the CPU across thread counts: intra-op
  reductions are split per thread, so ``num_threads`` (0 = torch's default, the number of cores)
  is part of the recipe; the provenance records the count used;
* which weights a ``snapshot_minutes`` snapshot or which rows a ``checkpoint_minutes`` checkpoint
  closes (durations and throughput are in no output: the run log's ``timings``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
from pathlib import Path
from typing import Any

import torch

from pipeline.core.arithmetic import (
    PORTABLE_CAPABILITY,
    PORTABLE_ENV,
    PORTABLE_MKL_BRANCH,
    ComputeConfig,
    host_specific_reasons,
    is_x86_64,
)
from pipeline.core.errors import BertraceError

CUBLAS_WORKSPACE = ":4096:8"


def torchrun_local_rank() -> int | None:
    """This process's LOCAL_RANK when torchrun started several (WORLD_SIZE > 1), else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("LOCAL_RANK") is not None:
        return int(os.environ["LOCAL_RANK"])
    return None


def _cuda_index(index: int | None) -> int:
    """The GPU of this process. Under torchrun every rank takes GPU ``LOCAL_RANK`` (modulo the
    GPUs it sees, so several ranks can share one GPU for a test), whatever index ``cuda:N``
    names: one index for all ranks would put every rank on the same GPU. CUDA_VISIBLE_DEVICES
    chooses which GPUs a multi-process run uses; ``cuda:N`` chooses the GPU of a single process."""
    local = torchrun_local_rank()
    if local is not None:
        return local % max(torch.cuda.device_count(), 1)
    return torch.cuda.current_device() if index is None else index


def resolve_device(name: str, param: str = "pretrain.device") -> torch.device:
    """``auto`` is cuda → mps → cpu; anything else must name a device torch can use (``param``
    is the params.yaml key the name came from, for the error message). Under torchrun a CUDA
    device is always the rank's own GPU (``LOCAL_RANK``, see :func:`_cuda_index`)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", _cuda_index(None))
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
    if device.type == "cuda":
        device = torch.device("cuda", _cuda_index(device.index))
    return device


def bf16_native() -> bool:
    """Whether the current GPU computes bf16 natively (Ampere and later). ``is_bf16_supported()``
    alone also says yes where bf16 is only emulated (T4, V100: slow), where fp16 + GradScaler is
    the right choice."""
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch < 2.4 has no including_emulation and counts native support only
        return bool(torch.cuda.is_bf16_supported())


def cpu_bf16_native() -> bool:
    """Whether this CPU has bf16 matmul instructions, which oneDNN uses for CPU autocast's bf16
    matmuls: x86 AVX512-BF16 or AMX-BF16 (Cooper Lake, Sapphire Rapids and later Xeons; Zen 4
    and later EPYC), Arm BF16 / SVE-BF16 (Graviton 3 and later). Without them bf16 is emulated
    with fp32 arithmetic plus conversions: slower than fp32. ``BERTRACE_CPU_BF16=0`` (or 1)
    overrides the detection (e.g. to keep a run's fp32 results on a newer machine). Under the
    portable pins (pipeline/core/arithmetic.py) oneDNN stops at AVX2: no bf16 instructions."""
    forced = os.environ.get("BERTRACE_CPU_BF16")
    if forced in ("0", "1"):
        return forced == "1"
    if os.environ.get("ONEDNN_MAX_CPU_ISA") == PORTABLE_ENV["ONEDNN_MAX_CPU_ISA"]:
        return False
    caps = getattr(torch.cpu, "get_capabilities", None)
    if caps is not None:
        c = caps()
        return bool(c.get("avx512_bf16") or c.get("amx_bf16") or c.get("bf16") or c.get("sve_bf16"))
    return bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())


def resolve_precision(name: str, device: torch.device) -> tuple[torch.dtype | None, bool]:
    """``(autocast dtype or None for fp32, use a GradScaler)``. ``auto``: bf16 on a GPU with native
    bf16, else fp16 + GradScaler; on a CPU bf16 autocast where it is native (:func:`cpu_bf16_native`),
    else fp32; fp32 on MPS. On this project's Xeon (AMX-BF16), 4 layers / 256 hidden, dropout 0.1,
    batch 32 x 128, one thread (bench/bench_model.py --variants): the training step 1.65x faster
    than fp32 (898 vs 1483 ms), and 300 updates of a tiny model follow fp32's loss curve (final MLM
    loss 3.486 vs 3.502; validation 3.519 vs 3.534). Still bit-reproducible: two bf16 runs give the
    same weights (tests/unit/pretrain/test_electra.py), but not fp32's."""
    if name == "auto":
        if device.type == "cpu":
            return (torch.bfloat16, False) if cpu_bf16_native() else (None, False)
        if device.type != "cuda":
            return None, False
        name = "bf16" if bf16_native() else "fp16"
    if name == "fp32":
        return None, False
    if name == "bf16":
        if device.type == "cuda" and not bf16_native():
            raise BertraceError(
                "params.yaml: pretrain.precision = bf16, but this GPU has no native bf16 (only a "
                "slow emulation); use auto or fp16"
            )
        if device.type not in ("cuda", "cpu"):
            raise BertraceError(f"params.yaml: pretrain.precision = bf16 is not supported on {device.type}; use fp32")
        return torch.bfloat16, False
    if device.type != "cuda":
        raise BertraceError(f"params.yaml: pretrain.precision = fp16 needs a CUDA GPU (device is {device}); use auto")
    return torch.float16, True


def precision_name(autocast_dtype: torch.dtype | None) -> str:
    """fp32 | bf16 | fp16 for a :func:`resolve_precision` dtype."""
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[autocast_dtype]


def fused_adamw(device: torch.device) -> bool:
    """Build AdamW with ``fused=True`` on this device: one kernel per step on CUDA; on the CPU one
    vectorised ATen kernel per parameter (element-wise, so the same bytes at any thread count, and
    under the portable pins its AVX2 build), 1.2 ms against 4.5 ms for the per-op update of the
    2/128 model's 2.6 M parameters."""
    return device.type in ("cuda", "cpu")


def build_adamw(
    groups: Any, device: torch.device, *, lr: float, betas: tuple[float, float], eps: float
) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) as every training loop builds it: fused where
    :func:`fused_adamw` says so, the per-op update elsewhere. ``groups`` as ``torch.optim`` takes
    them (weight decay per group)."""
    return torch.optim.AdamW(
        groups, lr=lr, betas=tuple(betas), eps=eps, **({"fused": True} if fused_adamw(device) else {})
    )


def amp_dtype(device: torch.device) -> torch.dtype | None:
    """Autocast dtype for fine-tuning and evaluation (no params key): bf16 on a GPU with native
    bf16, fp16 on older GPUs (training then needs a GradScaler), None (fp32) elsewhere."""
    if device.type != "cuda":
        return None
    return torch.bfloat16 if bf16_native() else torch.float16


# Dense peak FLOP/s per GPU for model-FLOPs utilisation (vendor datasheets, no sparsity), matched
# against torch.cuda.get_device_name() as whole words, first match wins: variants come before
# their family (H100 PCIe / NVL before H100 SXM; L40S and L40 are not L4). "tf32" is the peak
# of fp32 matmuls with TF32 on (pretrain.tf32, Ampere and later); T4 / V100 have no TF32 or bf16.
_H100_SXM = {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12}
_HOPPER_NVL = {"bf16": 835e12, "fp16": 835e12, "tf32": 418e12, "fp32": 60e12}
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    (r"\bH100\b.*\bPCIe\b", {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    (r"\bH100\b.*\bNVL\b", _HOPPER_NVL),
    (r"\bH200\b.*\bNVL\b", _HOPPER_NVL),
    (r"\b(H100|H200|GH200)\b", _H100_SXM),  # SXM ("H100 80GB HBM3"), H200 SXM, Grace Hopper
    (r"\bA100\b", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    (r"\bL40S\b", {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12}),
    (r"\bL40\b", {"bf16": 181e12, "fp16": 181e12, "tf32": 90.5e12, "fp32": 90.5e12}),
    (r"\bL4\b", {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30e12}),
    (r"\bA10\b", {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12}),
    (r"\bV100\b.*\bPCIe\b", {"fp16": 112e12, "fp32": 14e12}),
    (r"\bV100\b", {"fp16": 125e12, "fp32": 15.7e12}),  # SXM2
    (r"\bT4\b", {"fp16": 65e12, "fp32": 8.1e12}),
]


def peak_flops(device: torch.device, precision: str, tf32: bool = False) -> float | None:
    """Dense peak FLOP/s of ``device`` at ``precision`` (fp32 | bf16 | fp16) from PEAK_FLOPS; None if
    unknown. ``tf32``: fp32 matmuls run as TF32 (``pretrain.tf32``), so fp32 uses the TF32 peak."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peaks = next((p for pattern, p in PEAK_FLOPS if re.search(pattern, name, re.IGNORECASE)), None)
    if peaks is None:
        return None
    if precision == "fp32" and tf32 and "tf32" in peaks:
        return peaks["tf32"]
    return peaks.get(precision)


def mfu(flops_per_s: float, device: torch.device, precision: str, world: int = 1, tf32: bool = False) -> float | None:
    """Model FLOPs utilisation (PaLM, Chowdhery et al. 2022, app. B) on a known GPU, else None."""
    peak = peak_flops(device, precision, tf32)
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
        **(
            {"cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
            if on and device.type == "cuda"
            else {}
        ),
    }


def restore_deterministic(enabled: bool) -> None:
    """Put ``torch.use_deterministic_algorithms`` back as it was before :func:`set_deterministic`."""
    torch.use_deterministic_algorithms(enabled)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what the platform module says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# mkl_cbwr.h's branch values (MKL_CBWR_BRANCH): what mkl_branch() names
MKL_CBWR_BRANCHES = {
    1: "OFF",
    2: "AUTO",
    3: "COMPATIBLE",
    4: "SSE2",
    6: "SSSE3",
    7: "SSE4_1",
    8: "SSE4_2",
    9: "AVX",
    10: "AVX2",
    11: "AVX512_MIC",
    12: "AVX512",
    13: "AVX512_MIC_E1",
    14: "AVX512_E1",
}


def mkl_branch() -> str | None:
    """The conditional-numerical-reproducibility branch MKL runs in this process: ``AVX2`` under the
    portable pins; ``OFF`` where ``MKL_CBWR`` is unset (MKL picks its fastest path); ``AUTO`` where
    MKL ignored ``MKL_CBWR=AVX2``, as on an AMD CPU without the vendor shim
    (pipeline/core/arithmetic.py). Read from torch's statically linked MKL through
    ``mkl_serv_cbwr_get(MKL_CBWR_BRANCH)``, the function behind ``mkl_cbwr_get``, which the wheel
    does not export; None where torch has no such MKL (not x86-64 Linux)."""
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        get = ctypes.CDLL(str(lib)).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    value = get(1)
    return MKL_CBWR_BRANCHES.get(value, f"branch {value}")


def apply_arithmetic(cfg: ComputeConfig) -> None:
    """Apply ``compute.kernels`` after torch loaded (pipeline/core/arithmetic.py): in portable mode on
    x86-64, switch oneDNN off and check that the environment pins took effect, i.e. that they were
    set before torch ran its first kernel (``stages.arithmetic`` does so for every stage)."""
    if cfg.kernels != "portable" or not is_x86_64():
        return
    torch.backends.mkldnn.enabled = False
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != PORTABLE_CAPABILITY:
        if os.environ.get("ATEN_CPU_CAPABILITY") == PORTABLE_ENV["ATEN_CPU_CAPABILITY"]:
            raise BertraceError(
                f"params.yaml: compute.kernels = portable needs AVX2, which this CPU ({cpu_model()}) "
                f"lacks (torch runs {capability} kernels); set compute.kernels: native"
            )
        raise BertraceError(
            f"params.yaml: compute.kernels = portable, but torch already runs {capability} kernels: "
            "the pins must be set before torch loads; run the stage as `python -m stages.<name>` "
            "(dvc repro does), or export " + " ".join(f"{k}={v}" for k, v in PORTABLE_ENV.items())
        )
    branch = mkl_branch()
    if branch not in (None, PORTABLE_MKL_BRANCH):
        raise BertraceError(
            f"params.yaml: compute.kernels = portable, but MKL runs its {branch} branch on this CPU "
            f"({cpu_model()}), not {PORTABLE_MKL_BRANCH}: MKL's vendor shim was not loaded before torch; "
            "run the stage as `python -m stages.<name>` with a C compiler installed (it builds the shim), "
            "or set compute.kernels: native"
        )


def arithmetic_state(device: torch.device, precision: str, threads_fixed: bool) -> dict[str, Any]:
    """The arithmetic a run actually used, read from torch and the environment (not from params),
    for provenance and ``trace``: ``kernels`` is ``portable`` only when every pin of
    pipeline/core/arithmetic.py is in force. ``host_specific`` lists why another kind of host would
    compute other bytes (empty: any x86-64 CPU with AVX2 recomputes them), and then ``cpu``, the
    model of this one."""
    capability = torch.backends.cpu.get_cpu_capability()
    pinned = (
        capability == PORTABLE_CAPABILITY
        and not torch.backends.mkldnn.enabled
        and all(os.environ.get(k) == v for k, v in PORTABLE_ENV.items())
    )
    state = {
        "kernels": "portable" if pinned else "native",
        "cpu_capability": capability,
        "mkl_cbwr": os.environ.get("MKL_CBWR"),
        "mkl_branch": mkl_branch(),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "mkldnn": bool(torch.backends.mkldnn.enabled),
        "device": device.type,
        "precision": precision,
        "threads": torch.get_num_threads(),
        "threads_fixed": bool(threads_fixed),
        "machine": platform.machine(),
    }
    state["host_specific"] = host_specific_reasons(state)
    if state["host_specific"]:  # which host can rebuild them; portable bytes name no host
        state["cpu"] = cpu_model()
    return state
