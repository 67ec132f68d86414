"""bench/bench_data_half.py end to end on a 3 MB synthetic corpus: every stage runs as the real
stage, is measured, the 1-worker rerun and the DVC disk measurement happen, and the projection
adds up, and clean runs on a Dask LocalCluster paired with the local engine (the numbers themselves
are BENCHMARKS.md's business)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_bench_runs_every_stage_and_measures_it(tmp_path):
    out = tmp_path / "result.json"
    cmd = [
        sys.executable,
        str(REPO / "bench/bench_data_half.py"),
        "--sizes",
        "0.003",
        "--scaling-size",
        "0.003",
        "--pairs",
        "2",
        "--dask-size",
        "0.003",
    ]
    cmd += ["--work", str(tmp_path / "work"), "--json", str(out), "--workers", "2", "--cores", "2", "8"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    (size,) = result["sizes"]
    assert 0.0029 < size["gb"] < 0.0031 and size["corpus"]["distinct_words"] > 10_000
    stages = size["stages"]
    assert list(stages) == ["download", "clean", "tokenizer", "examples", "validate"]
    for name, s in stages.items():
        assert s["cpu_s"] > 0.3 and s["wall_s"] > 0 and 50 < s["peak_rss_mb"] <= s["peak_tree_rss_mb"], name
        assert s["cpu_s_per_gb"] == pytest.approx(s["cpu_s"] / size["gb"])
    assert stages["examples"]["disk_gb"] > 0.001 and stages["clean"]["disk_gb"] > 0.002
    assert set(size["one_worker"]) == {"tokenizer", "examples", "validate"}
    for one in size["one_worker"].values():  # --pairs 2: two paired runs, their median speedup
        assert len(one["speedups"]) == 2 and one["speedup"] == pytest.approx(sum(one["speedups"]) / 2, abs=1e-3)
    dask = size["clean_dask"]  # local then Dask clean, twice: their CPU ratios and the median
    assert len(dask["cpu_ratios"]) == 2 and dask["cpu_ratio"] == pytest.approx(sum(dask["cpu_ratios"]) / 2, abs=1e-3)
    assert dask["cpu_s"] > 0.3 and dask["local_cpu_s"] > 0.3 and "clean on a Dask LocalCluster" in proc.stdout
    disk = size["disk"]
    assert disk["cache_type"] == "hardlink,symlink,copy" and 1.0 <= disk["ratio"] < 1.3  # linked: stored once
    two, eight = result["projection_20gb"]["2"], result["projection_20gb"]["8"]
    assert two["total"] == pytest.approx(sum(v for k, v in two.items() if k != "total"))
    assert 0 < eight["total"] <= two["total"]
    assert "20 GB on 2 cores" in proc.stdout and "1 -> 2 workers" in proc.stdout
    assert not (tmp_path / "work" / "0.003gb").exists()  # removed unless --keep
