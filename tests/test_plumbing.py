"""Atomic writes, hashing, provenance records, stage error handling."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import provenance as prov
from pipeline.io import atomic_open, sha256_file, sha256_json, write_json
from tests.conftest import REPO


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_open(target) as f:
            f.write("half")
            raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temp file left


def test_atomic_write_replaces_on_success(tmp_path):
    target = tmp_path / "sub" / "out.json"
    write_json(target, {"b": 1, "a": [1, 2]})
    assert json.loads(target.read_text()) == {"a": [1, 2], "b": 1}
    assert sha256_file(target) == hashlib.sha256(target.read_bytes()).hexdigest()


def test_params_hash_ignores_key_order_but_not_values():
    assert sha256_json({"a": 1, "b": 2}) == sha256_json({"b": 2, "a": 1})
    assert sha256_json({"a": 1, "b": 2}) != sha256_json({"a": 1, "b": 3})


def test_hash_path_of_directory_changes_with_any_file(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("1")
    (tmp_path / "d" / "y").write_text("2")
    h1 = prov.hash_path(tmp_path / "d")
    (tmp_path / "d" / "y").write_text("3")
    assert prov.hash_path(tmp_path / "d") != h1


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_git_state_reports_commit_and_dirty_but_ignores_run_products(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "dvc.lock").write_text("a\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "c")
    state = prov.git_state(tmp_path)
    assert len(state["commit"]) == 40 and state["dirty"] is False
    (tmp_path / "dvc.lock").write_text("b\n")  # dvc repro rewrites it while running
    assert prov.git_state(tmp_path)["dirty"] is False
    (tmp_path / "data" / "raw").mkdir(parents=True)  # a fresh DVC output, not yet git-ignored
    (tmp_path / "data" / "raw" / "part-0.parquet").write_text("x")
    assert prov.git_state(tmp_path)["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    state = prov.git_state(tmp_path)
    assert state["dirty"] is True and state["dirty_paths"] == ["code.py"]


def test_git_state_outside_git(tmp_path):
    assert prov.git_state(tmp_path)["commit"] is None


def test_pipeline_run_id_from_env(monkeypatch):
    monkeypatch.setenv("BERTRACE_PIPELINE_RUN_ID", "abc123")
    assert prov.pipeline_run_id() == "abc123"


def test_pipeline_run_id_standalone_is_fresh(monkeypatch):
    monkeypatch.delenv("BERTRACE_PIPELINE_RUN_ID", raising=False)
    assert prov.pipeline_run_id() != prov.pipeline_run_id()


def test_stage_with_missing_input_fails_with_one_clear_line(tmp_path):
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    env = {**os.environ, "PYTHONPATH": str(REPO), "BERTRACE_NO_MLFLOW": "1"}
    proc = subprocess.run([sys.executable, "-m", "stages.tokenizer"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "data/clean/train.txt" in proc.stderr and proc.stderr.startswith("error:")


def test_stage_without_params_section_names_the_file(tmp_path):
    (tmp_path / "params.yaml").write_text("download: {}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "BERTRACE_NO_MLFLOW": "1"}
    proc = subprocess.run([sys.executable, "-m", "stages.clean"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "params.yaml: has no 'clean:' section" in proc.stderr


def test_atomic_write_gives_the_usual_file_mode(tmp_path):
    write_json(tmp_path / "m.json", {})
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o666 & ~mask
