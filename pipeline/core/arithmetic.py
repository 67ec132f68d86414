"""Which CPU kernels a torch stage runs: the ``compute`` section of params.yaml (no torch here).

The same fp32 program gives other bytes on another CPU because its libraries pick kernels by the
instructions they find: ATen's vectorised ops (and the Sleef math under them) have AVX2 and
AVX-512 builds, MKL's sgemm has a code path per instruction set, and oneDNN uses AVX-512 / AMX
where present. Each reads an environment variable once, when it first runs, so a process must set
them before torch is imported (``stages.arithmetic`` does, as the first import of every stage
that runs torch):

* ``ATEN_CPU_CAPABILITY=avx2``: ATen dispatches to its AVX2 kernels on any CPU that has AVX2
  (checked after import: ``torch.backends.cpu.get_cpu_capability()``);
* ``MKL_CBWR=AVX2``: MKL's conditional numerical reproducibility on its AVX2 branch (fixed cache
  sizes, deterministic reductions, static scheduling): the same sgemm results on every Intel CPU
  with AVX2. On AMD CPUs MKL honours only AUTO and COMPATIBLE and takes its AUTO branch instead,
  which the golden test checks per AMD host kind (docs/reproducibility.md); COMPATIBLE (SSE2, any
  vendor) made the default's step 2.5x slower. ``MKL_DYNAMIC=FALSE``: MKL never chooses its own
  thread count;
* ``ONEDNN_MAX_CPU_ISA=AVX2`` (and its older name ``DNNL_MAX_CPU_ISA``): oneDNN's kernels stop at
  AVX2; ``torch.backends.mkldnn`` is also switched off (:func:`pipeline.core.device.apply_arithmetic`),
  so no fp32 op takes a oneDNN path at all.

With fp32 and a fixed thread count (intra-op reductions are split per thread) this is the
*portable* mode: the same commit, params and data give the same bytes on any x86-64 CPU with AVX2
(Haswell 2013+, Zen 1+), whatever AVX-512 or AMX it also has, as far as the golden test has
checked (AMD hosts: see MKL above). ``native`` leaves every library its
fastest choice: host-specific bytes, recorded as such (docs/reproducibility.md).
"""

from __future__ import annotations

import platform
from typing import Any, ClassVar, Literal

from pipeline.core.config import Section

PORTABLE_ENV: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "MKL_DYNAMIC": "FALSE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "DNNL_MAX_CPU_ISA": "AVX2",
}
PORTABLE_CAPABILITY = "AVX2"  # what torch.backends.cpu.get_cpu_capability() reports under the pins
X86_64 = ("x86_64", "amd64")


class ComputeConfig(Section):
    """The ``compute`` section of params.yaml (defaults equal params.yaml; tests/unit/core/test_config.py)."""

    SECTION: ClassVar[str] = "compute"

    kernels: Literal["portable", "native"] = "portable"


def is_x86_64(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in X86_64


def process_env(cfg: ComputeConfig, machine: str | None = None) -> dict[str, str]:
    """The environment a stage process needs before torch loads: :data:`PORTABLE_ENV` in portable
    mode on x86-64, nothing otherwise (native kernels; other architectures have no such pins)."""
    return dict(PORTABLE_ENV) if cfg.kernels == "portable" and is_x86_64(machine) else {}


def host_specific_reasons(arithmetic: dict[str, Any]) -> list[str]:
    """Why a run's recorded ``arithmetic`` (:func:`pipeline.core.device.arithmetic_state`) is tied to its
    kind of host; empty when any x86-64 CPU with AVX2 recomputes its bytes."""
    reasons = []
    device = str(arithmetic.get("device") or "cpu")
    if device != "cpu":
        reasons.append(f"computed on {device}")
    if arithmetic.get("kernels") != "portable":
        reasons.append(
            f"compute.kernels {arithmetic.get('kernels') or 'not recorded'}"
            + (f" ({arithmetic['cpu_capability']} kernels)" if arithmetic.get("cpu_capability") else "")
        )
    elif arithmetic.get("cpu_capability") != PORTABLE_CAPABILITY:
        reasons.append(f"{arithmetic.get('cpu_capability')} kernels, not {PORTABLE_CAPABILITY}")
    if arithmetic.get("precision") not in (None, "fp32"):
        reasons.append(f"{arithmetic['precision']} autocast")
    if not arithmetic.get("threads_fixed", True):
        reasons.append(f"threads 0 ({arithmetic.get('threads')} on that host: its core count)")
    if not is_x86_64(str(arithmetic.get("machine") or "x86_64")):
        reasons.append(f"a {arithmetic.get('machine')} CPU (portable kernels are x86-64's)")
    return reasons


def host_line(arithmetic: dict[str, Any]) -> str:
    """``portable arithmetic: ...`` or ``host-specific arithmetic (...): rebuild on a <cpu> host``."""
    reasons = host_specific_reasons(arithmetic)
    if not reasons:
        return "portable arithmetic: fp32 on AVX2 kernels, any x86-64 CPU with AVX2 rebuilds these bytes"
    where = arithmetic.get("cpu") or arithmetic.get("machine") or "the same kind of"
    return f"host-specific arithmetic ({', '.join(reasons)}): rebuild on a {where} host"
