"""The golden test: the committed weight hashes of a tiny pre-training and fine-tuning
(tests/support/golden.py) are rebuilt bit for bit on this host. Its arithmetic is params.yaml's
default (portable kernels, fp32, 2 threads), so it must pass on any x86-64 CPU with AVX2;
the hosts it passed on are listed in docs/reproducibility.md."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

GOLDEN = REPO / "tests" / "support" / "golden" / "weights.json"
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


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="portable kernels are x86-64's")
def test_golden_weights_are_rebuilt_bit_for_bit_on_this_host():
    expected = json.loads(GOLDEN.read_text(encoding="utf-8"))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / "golden.py")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["torch"] == expected["torch"], (
        f"torch {got['torch']} here, the golden hashes are torch {expected['torch']}'s (constraints.txt pins it)"
    )
    assert (got["kernels"], got["cpu_capability"]) == ("portable", "AVX2"), got
    differ = [name for name in got["tensors"] if got["tensors"][name] != expected["tensors"].get(name)]
    assert set(got["tensors"]) == set(expected["tensors"]), "the golden run's tensors changed names"
    assert not differ, (
        f"{len(differ)} of {len(got['tensors'])} golden tensors differ on this host, {host()}: first {differ[0]} "
        f"(pre-training loss {got['pretrain_loss']!r}, golden {expected['pretrain_loss']!r}). This CPU's arithmetic "
        "differs from the golden host's; record it in docs/reproducibility.md. After a deliberate change to the "
        "recipe: python tests/support/golden.py --write"
    )
    assert got["finetune_losses"] == expected["finetune_losses"]
