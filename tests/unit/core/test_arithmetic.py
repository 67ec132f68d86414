"""params.yaml ``compute``: the CPU kernel pins reach a stage process before torch loads, a pin
set too late is one clear error, and the record says which arithmetic a run used and whether
another kind of host rebuilds its bytes (pipeline/core/arithmetic.py, stages/arithmetic.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from pipeline.core.arithmetic import PORTABLE_ENV, ComputeConfig, host_line, host_specific_reasons, process_env
from pipeline.core.errors import BertraceError
from tests.conftest import REPO

PROBE = (
    "import os, stages.arithmetic, torch; "
    "print(os.environ.get('MKL_CBWR'), os.environ.get('ONEDNN_MAX_CPU_ISA'), torch.backends.cpu.get_cpu_capability())"
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
    assert out == ["AVX2", "AVX2", "AVX2"]
    # a conflicting variable in the caller's shell does not win over params.yaml
    env = {**_unpinned_env(), "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AUTO"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["AVX2", "AVX2", "AVX2"]
    # native: nothing is pinned
    _params(tmp_path, "native")
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, env=_unpinned_env(), capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[:2] == ["None", "None"]


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
