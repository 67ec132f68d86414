"""The golden test: the committed weight hashes of a tiny pre-training and fine-tuning
(tests/support/golden.py) are rebuilt bit for bit on this host. Its arithmetic is params.yaml's
default (portable kernels, fp32, 2 threads), so it must pass on any x86-64 CPU with AVX2;
the hosts it passed on are listed in docs/reproducibility.md.

The same run on other kinds of CPU, emulated: qemu-user (Debian's ``qemu-user``; .ci/run installs
it) runs this host's Python and torch on a CPU model of its choosing, answering CPUID as that CPU
would (vendor, family, instruction sets), so every library picks the kernels it would pick there,
and executes them with exact IEEE arithmetic. An Intel CPU without AVX-512 (Haswell) and AMD Zen 1
(EPYC 7001) and Zen 3 (EPYC 7003) rebuild the golden bytes; on Zen without MKL's vendor shim
(pipeline/core/arithmetic.py) MKL leaves its AVX2 branch, and the stage stops saying so."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.arithmetic import PORTABLE_ENV
from pipeline.core.device import cpu_model
from tests.conftest import REPO

GOLDEN = REPO / "tests" / "support" / "golden" / "weights.json"
QEMU = shutil.which("qemu-x86_64")
# qemu's CPU models (qemu-x86_64 -cpu help): the kinds of host this project's machines come as,
# without AVX-512 (qemu 7.2 emulates AVX2 and FMA, not AVX-512)
EMULATED_CPUS = {
    "Haswell-v4": "Intel Haswell (AVX2, no AVX-512)",
    "EPYC-v1": "AMD Zen 1 (EPYC 7001)",
    "EPYC-Milan-v1": "AMD Zen 3 (EPYC 7003)",
}
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx_vnni")


def host() -> str:
    """``<model name> (family F model M; avx2 avx512f ...)`` from /proc/cpuinfo."""
    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    flags = set(info.get("flags", "").split())
    return (
        f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model {info.get('model', '?')}; "
        f"{' '.join(f for f in FLAGS if f in flags) or 'no AVX2'})"
    )


X86_64 = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"), reason="portable kernels are x86-64's"
)
NEEDS_QEMU = pytest.mark.skipif(QEMU is None, reason="qemu-user is not installed (Debian: apt install qemu-user)")


def golden_run(*emulator: str, timeout: int = 600) -> dict:
    """tests/support/golden.py's JSON, run in a process of its own (under ``emulator``, if given)."""
    proc = subprocess.run(
        [*emulator, sys.executable, str(REPO / "tests" / "support" / "golden.py")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@X86_64
def test_golden_weights_are_rebuilt_bit_for_bit_on_this_host():
    check_golden(golden_run(), host())


@pytest.mark.slow
@X86_64
@NEEDS_QEMU
@pytest.mark.parametrize("cpu", sorted(EMULATED_CPUS))
def test_golden_weights_are_rebuilt_bit_for_bit_on_an_emulated_cpu(cpu):
    check_golden(golden_run(QEMU, "-cpu", cpu, timeout=1800), f"{EMULATED_CPUS[cpu]}, emulated by qemu -cpu {cpu}")


@pytest.mark.slow
@X86_64
@NEEDS_QEMU
def test_on_amd_without_the_vendor_shim_mkl_leaves_avx2_and_the_stage_stops(tmp_path):
    code = (
        "import stages.arithmetic, torch; from pipeline.core.device import apply_arithmetic; "
        "from pipeline.core.arithmetic import ComputeConfig; from stages.common import run_stage; "
        "run_stage(lambda: apply_arithmetic(ComputeConfig()))"
    )
    # CC=false: the shim cannot be built (an empty cache, so nothing is reused)
    env = {**os.environ, "CC": "false", "BERTRACE_CACHE": str(tmp_path), "PYTHONPATH": str(REPO)}
    env = {k: v for k, v in env.items() if k not in PORTABLE_ENV}
    proc = subprocess.run(
        [QEMU, "-cpu", "EPYC-v1", sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("qemu-x86_64: warning")]
    assert errors == [
        f"error: params.yaml: compute.kernels = portable, but MKL runs its AUTO branch on this CPU ({cpu_model()}), "
        "not AVX2: MKL's vendor shim was not loaded before torch; run the stage as `python -m stages.<name>` with "
        "a C compiler installed (it builds the shim), or set compute.kernels: native"
    ]


def check_golden(got: dict, where: str) -> None:
    expected = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert got["torch"] == expected["torch"], (
        f"torch {got['torch']} here, the golden hashes are torch {expected['torch']}'s (constraints.txt pins it)"
    )
    assert (got["kernels"], got["cpu_capability"], got["mkl_branch"]) == ("portable", "AVX2", "AVX2"), got
    differ = [name for name in got["tensors"] if got["tensors"][name] != expected["tensors"].get(name)]
    assert set(got["tensors"]) == set(expected["tensors"]), "the golden run's tensors changed names"
    assert not differ, (
        f"{len(differ)} of {len(got['tensors'])} golden tensors differ on {where}: first {differ[0]} "
        f"(pre-training loss {got['pretrain_loss']!r}, golden {expected['pretrain_loss']!r}). This CPU's arithmetic "
        "differs from the golden host's; record it in docs/reproducibility.md. After a deliberate change to the "
        "recipe: python tests/support/golden.py --write"
    )
    assert got["finetune_losses"] == expected["finetune_losses"]
