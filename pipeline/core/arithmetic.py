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
  sizes, deterministic reductions, static scheduling): the same sgemm results on every CPU with
  AVX2. MKL honours that branch only where its vendor check, ``mkl_serv_intel_cpu_true``, says
  Intel; on an AMD CPU it silently takes its AUTO branch, other bytes (44 of the golden test's 48
  tensors on an emulated Zen 1). :func:`load_mkl_vendor_shim` loads a one-line library that
  answers that check with "yes" before torch loads, so AMD CPUs run the same AVX2 branch (MKL calls
  the check through libtorch_cpu.so's PLT, so a library loaded first into the global symbol scope
  takes the call); :func:`pipeline.core.device.mkl_branch` reads back the branch MKL runs.
  COMPATIBLE (SSE2, any vendor, no shim) made the default's step 2.5x slower. ``MKL_DYNAMIC=FALSE``:
  MKL never chooses its own thread count;
* ``ONEDNN_MAX_CPU_ISA=AVX2`` (and its older name ``DNNL_MAX_CPU_ISA``): oneDNN's kernels stop at
  AVX2; ``torch.backends.mkldnn`` is also switched off (:func:`pipeline.core.device.apply_arithmetic`),
  so no fp32 op takes a oneDNN path at all.

With fp32 and a fixed thread count (intra-op reductions are split per thread) this is the
*portable* mode: the same commit, params and data give the same bytes on any x86-64 CPU with AVX2
(Haswell 2013+, Zen 1+), whatever AVX-512 or AMX it also has, as far as the golden test has
checked (docs/reproducibility.md lists the hosts, real and emulated). ``native`` leaves every
library its fastest choice: host-specific bytes, recorded as such.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, ClassVar, Literal

from pipeline.core.config import Section
from pipeline.core.errors import BertraceError

PORTABLE_ENV: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "MKL_DYNAMIC": "FALSE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "DNNL_MAX_CPU_ISA": "AVX2",
}
PORTABLE_CAPABILITY = "AVX2"  # what torch.backends.cpu.get_cpu_capability() reports under the pins
PORTABLE_MKL_BRANCH = "AVX2"  # the branch MKL runs under MKL_CBWR=AVX2 (pipeline.core.device.mkl_branch)
# MKL's vendor check, answered "Intel" so that MKL_CBWR=AVX2 holds on AMD CPUs too (module docstring)
MKL_VENDOR_SHIM_C = "int mkl_serv_intel_cpu_true(void) { return 1; }\n"
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


def shim_cache_dir() -> Path:
    """Where the built shim is kept: ``$BERTRACE_CACHE`` or ``$XDG_CACHE_HOME/bertrace`` (~/.cache)."""
    if os.environ.get("BERTRACE_CACHE"):
        return Path(os.environ["BERTRACE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bertrace"


def build_mkl_vendor_shim(cache_dir: Path | None = None) -> Path:
    """The shared library of :data:`MKL_VENDOR_SHIM_C`, compiled once per source and machine with
    ``$CC`` (else ``cc``, ``gcc``) into ``cache_dir`` (written to a temporary name, then renamed).
    Raises :class:`BertraceError` naming the fix when no C compiler can build it."""
    cache_dir = Path(cache_dir) if cache_dir is not None else shim_cache_dir()
    digest = hashlib.sha256(f"{MKL_VENDOR_SHIM_C}{platform.machine()}".encode()).hexdigest()[:16]
    lib = cache_dir / f"mkl-vendor-shim-{digest}.so"
    if lib.is_file():
        return lib
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise BertraceError(
            "no C compiler (cc, gcc or $CC) to build the MKL vendor shim; install one (Debian: apt install gcc)"
        )
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".shim-") as tmp:
            src, out = Path(tmp) / "shim.c", Path(tmp) / "shim.so"
            src.write_text(MKL_VENDOR_SHIM_C, encoding="ascii")
            proc = subprocess.run(
                [compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(src)], capture_output=True, text=True
            )
            if proc.returncode != 0:
                why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                raise BertraceError(f"{compiler} could not build the MKL vendor shim ({why}); check the C compiler")
            os.replace(out, lib)
    except OSError as e:
        raise BertraceError(
            f"{cache_dir}: cannot write the MKL vendor shim ({e.strerror}); set BERTRACE_CACHE to a writable folder"
        ) from None
    return lib


def load_mkl_vendor_shim(cache_dir: Path | None = None) -> Path:
    """Build (:func:`build_mkl_vendor_shim`) and load the shim into the process's global symbol
    scope. Only effective before torch loads libtorch_cpu.so: a process calls it right after
    setting :func:`process_env`, as ``stages.arithmetic`` does. Harmless on Intel CPUs, where MKL's
    own check answers the same."""
    lib = build_mkl_vendor_shim(cache_dir)
    try:
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise BertraceError(
            f"{lib}: the MKL vendor shim does not load ({e}); set CC to a compiler for this machine and delete the file"
        ) from None
    return lib


def pin_process(cfg: ComputeConfig) -> None:
    """Put :func:`process_env` into ``os.environ`` and, when it pins anything, load MKL's vendor
    shim: what a process does before it imports torch (``stages.arithmetic``, the golden run, the
    benches). A shim that cannot be built is passed over: only AMD CPUs need it, and there
    :func:`pipeline.core.device.apply_arithmetic` stops the run, naming MKL's branch and the fix."""
    env = process_env(cfg)
    os.environ.update(env)
    if env:
        try:
            load_mkl_vendor_shim()
        except BertraceError:
            pass


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
    elif arithmetic.get("mkl_branch") not in (None, PORTABLE_MKL_BRANCH):  # None: recorded before it was read
        reasons.append(f"MKL's {arithmetic['mkl_branch']} branch, not {PORTABLE_MKL_BRANCH}")
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
