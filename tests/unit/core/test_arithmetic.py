"""params.yaml ``compute``: the CPU kernel pins reach a stage process before torch loads, a pin
set too late is one clear error, MKL's vendor shim is built once and says "Intel", and the record
says which arithmetic a run used and whether another kind of host rebuilds its bytes
(pipeline/core/arithmetic.py, stages/arithmetic.py). tests/e2e/test_golden.py runs the shim on an
emulated AMD CPU."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest
import yaml

from pipeline.core.arithmetic import (
    MKL_VENDOR_SHIM_C,
    PORTABLE_ENV,
    ComputeConfig,
    build_mkl_vendor_shim,
    host_line,
    host_specific_reasons,
    load_mkl_vendor_shim,
    process_env,
)
from pipeline.core.errors import BertraceError
from tests.conftest import REPO

PROBE = (
    "import os, stages.arithmetic, torch; from pipeline.core.device import mkl_branch; "
    "print(os.environ.get('MKL_CBWR'), os.environ.get('ONEDNN_MAX_CPU_ISA'), torch.backends.cpu.get_cpu_capability(), "
    "mkl_branch())"
)


def _unpinned_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENV}
    env["PYTHONPATH"] = str(REPO)
    return env


def _params(tmp_path, kernels):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"compute": {"kernels": kernels}}))


@pytest.mark.skipif(not process_env(ComputeConfig()), reason="portable kernels are x86-64's")
def test_a_stage_process_sets_the_pins_before_torch_loads(tmp_path):
    _params(tmp_path, "portable")
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, env=_unpinned_env(), capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["AVX2", "AVX2", "AVX2", "AVX2"]  # MKL reports the branch it runs
    # a conflicting variable in the caller's shell does not win over params.yaml
    env = {**_unpinned_env(), "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AUTO"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["AVX2", "AVX2", "AVX2", "AVX2"]
    # native: nothing is pinned
    _params(tmp_path, "native")
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, env=_unpinned_env(), capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[:2] == ["None", "None"]
    assert out[3] == "OFF"  # no reproducibility branch: MKL picks its fastest path


@pytest.mark.skipif(not process_env(ComputeConfig()), reason="portable kernels are x86-64's")
def test_pins_set_after_torch_ran_a_kernel_are_one_clear_error():
    code = (
        "import os, torch; torch.ones(3).sum(); os.environ.update(%r); "
        "from pipeline.core.device import apply_arithmetic; from pipeline.core.arithmetic import ComputeConfig; "
        "from stages.common import run_stage; run_stage(lambda: apply_arithmetic(ComputeConfig()))"
    )
    env = {**_unpinned_env(), "ATEN_CPU_CAPABILITY": "default"}
    proc = subprocess.run(
        [sys.executable, "-c", code % ({k: v for k, v in PORTABLE_ENV.items() if k != "ATEN_CPU_CAPABILITY"},)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: params.yaml: compute.kernels = portable, but torch already runs DEFAULT kernels: the pins must be "
        "set before torch loads; run the stage as `python -m stages.<name>` (dvc repro does), or export "
        + " ".join(f"{k}={v}" for k, v in PORTABLE_ENV.items())
    ]


def test_a_wrong_kernels_value_stops_the_stage_naming_the_key(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["compute"]["kernels"] = "fastest"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    proc = subprocess.run(
        [sys.executable, "-m", "stages.pretrain"], cwd=tmp_path, env=_unpinned_env(), capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: params.yaml: compute.kernels = 'fastest': input should be 'portable' or 'native'; fix it in params.yaml"
    ]
    with pytest.raises(BertraceError, match="compute.kernels"):
        ComputeConfig.from_params({"kernels": 1})


def test_only_x86_64_gets_the_pins():
    assert process_env(ComputeConfig(), machine="x86_64") == PORTABLE_ENV
    assert process_env(ComputeConfig(), machine="aarch64") == {}
    assert process_env(ComputeConfig(kernels="native"), machine="x86_64") == {}


def test_the_record_says_what_ties_the_bytes_to_a_host():
    portable = {
        "kernels": "portable",
        "cpu_capability": "AVX2",
        "device": "cpu",
        "precision": "fp32",
        "threads": 2,
        "threads_fixed": True,
        "machine": "x86_64",
    }
    assert host_specific_reasons(portable) == []
    assert host_line(portable) == (
        "portable arithmetic: fp32 on AVX2 kernels, any x86-64 CPU with AVX2 rebuilds these bytes"
    )
    assert host_specific_reasons({**portable, "threads_fixed": False, "threads": 16}) == [
        "threads 0 (16 on that host: its core count)"
    ]
    assert host_specific_reasons({**portable, "precision": "bf16"}) == ["bf16 autocast"]
    assert host_specific_reasons({**portable, "device": "cuda"}) == ["computed on cuda"]
    native = {**portable, "kernels": "native", "cpu_capability": "AVX512", "cpu": "Intel Xeon Platinum 8488C"}
    assert host_line(native) == (
        "host-specific arithmetic (compute.kernels native (AVX512 kernels)): rebuild on a "
        "Intel Xeon Platinum 8488C host"
    )


def test_the_mkl_vendor_shim_is_built_once_and_says_intel(tmp_path, monkeypatch):
    lib = build_mkl_vendor_shim(tmp_path)
    assert lib.parent == tmp_path and lib.suffix == ".so"
    assert [p.name for p in tmp_path.iterdir()] == [lib.name]  # no temporary left behind
    check = ctypes.CDLL(str(lib)).mkl_serv_intel_cpu_true
    check.restype = ctypes.c_int
    assert check() == 1
    # cached: a second build compiles nothing (no compiler is even looked for)
    stamp = lib.stat().st_mtime_ns
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert build_mkl_vendor_shim(tmp_path) == lib and lib.stat().st_mtime_ns == stamp
    assert "mkl_serv_intel_cpu_true" in MKL_VENDOR_SHIM_C


def test_a_shim_that_cannot_be_built_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BertraceError) as e:
        build_mkl_vendor_shim(tmp_path / "a")
    assert str(e.value) == (
        "no C compiler (cc, gcc or $CC) to build the MKL vendor shim; install one (Debian: apt install gcc)"
    )
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.raises(
        BertraceError, match=r"^false could not build the MKL vendor shim \(exit 1\); check the C compiler$"
    ):
        build_mkl_vendor_shim(tmp_path / "b")
    assert not list((tmp_path / "b").iterdir())  # nothing half-written


def test_a_shim_this_process_cannot_load_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """A compiler for another machine (a cross compiler as ``cc``) builds a file ``dlopen`` refuses."""
    cross = tmp_path / "cross-cc"
    cross.write_text('#!/bin/sh\nwhile [ "$1" != -o ]; do shift; done\nprintf "not an ELF file" > "$2"\n')
    cross.chmod(0o755)
    monkeypatch.setenv("CC", str(cross))
    with pytest.raises(BertraceError) as e:
        load_mkl_vendor_shim(tmp_path / "cache")
    (lib,) = (tmp_path / "cache").iterdir()
    message = str(e.value)
    assert message.startswith(f"{lib}: the MKL vendor shim does not load (") and "\n" not in message
    assert message.endswith("); set CC to a compiler for this machine and delete the file")


def test_mkl_on_another_branch_ties_the_bytes_to_the_host():
    portable = {"kernels": "portable", "cpu_capability": "AVX2", "device": "cpu", "precision": "fp32", "threads": 2}
    assert host_specific_reasons({**portable, "mkl_branch": "AVX2"}) == []
    assert host_specific_reasons(portable) == []  # records from before the branch was read
    assert host_specific_reasons({**portable, "mkl_branch": "AUTO"}) == ["MKL's AUTO branch, not AVX2"]
