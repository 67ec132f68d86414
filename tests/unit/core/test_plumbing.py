"""Atomic writes, hashing, provenance records, stage error handling."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.core.io import atomic_open, sha256_file, sha256_json, write_json
from pipeline.lineage import provenance as prov
from pipeline.lineage import runlog
from tests.conftest import REPO, empty_mlflow_store


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
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True, capture_output=True
    )


def test_git_state_reports_commit_and_dirty_but_ignores_run_products(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "dvc.lock").write_text("a\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "c")
    state = runlog.git_state(tmp_path)
    assert len(state["commit"]) == 40 and state["dirty"] is False
    (tmp_path / "dvc.lock").write_text("b\n")  # dvc repro rewrites it while running
    assert runlog.git_state(tmp_path)["dirty"] is False
    (tmp_path / "data" / "raw").mkdir(parents=True)  # a fresh DVC output, not yet git-ignored
    (tmp_path / "data" / "raw" / "part-0.parquet").write_text("x")
    assert runlog.git_state(tmp_path)["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    state = runlog.git_state(tmp_path)
    assert state["dirty"] is True and state["dirty_paths"] == ["code.py"]


def test_git_state_outside_git(tmp_path):
    assert runlog.git_state(tmp_path)["commit"] is None


def test_pipeline_run_id_from_env(monkeypatch):
    monkeypatch.setenv("BERTRACE_PIPELINE_RUN_ID", "abc123")
    assert runlog.pipeline_run_id() == "abc123"


def test_pipeline_run_id_standalone_is_fresh(monkeypatch):
    monkeypatch.delenv("BERTRACE_PIPELINE_RUN_ID", raising=False)
    assert runlog.pipeline_run_id() != runlog.pipeline_run_id()


def test_stage_with_missing_input_fails_with_one_clear_line(tmp_path):
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    env = {**os.environ, "PYTHONPATH": str(REPO), "BERTRACE_NO_MLFLOW": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "stages.tokenizer"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "data/clean/train.txt" in proc.stderr and proc.stderr.startswith("error:")


def test_stage_without_params_section_names_the_file(tmp_path):
    (tmp_path / "params.yaml").write_text("download: {}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "BERTRACE_NO_MLFLOW": "1"}
    proc = subprocess.run([sys.executable, "-m", "stages.clean"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "params.yaml: has no 'clean:' section" in proc.stderr


def test_atomic_write_gives_the_usual_file_mode(tmp_path):
    write_json(tmp_path / "m.json", {})
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o666 & ~mask


def test_git_state_ignores_dvc_internal_files(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("[core]\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "c")
    (tmp_path / ".dvc" / "tmp").mkdir(parents=True)
    (tmp_path / ".dvc" / ".gitignore").write_text("/cache\n")  # `dvc repro` writes it on first use
    (tmp_path / ".dvc" / "tmp" / "lock").write_text("")
    assert runlog.git_state(tmp_path)["dirty"] is False


def test_chain_ids_prefer_what_the_downstream_stage_consumed():
    tok = {
        "stage": "tokenizer",
        "inputs": {"data/clean/train.txt": "c1"},
        "outputs": {"data/tokenizer/tokenizer.json": "t1", "data/tokenizer/vocab.txt": "v1"},
    }
    ex = {
        "stage": "examples",
        "inputs": {"data/tokenizer/tokenizer.json": "t1"},
        "outputs": {"data/examples/manifest.json": "e1"},
        "upstream": {"tokenizer": tok},
    }
    pre = {
        "stage": "pretrain",
        "inputs": {"data/examples/manifest.json": "e1"},
        "outputs": {"data/pretrain/best.pt": "b1", "data/pretrain/last.pt": "l1"},
        "upstream": {"examples": ex},
    }
    ft = {
        "stage": "finetune",
        "inputs": {"data/pretrain/last.pt": "l1", "data/tokenizer/tokenizer.json": "t1"},
        "outputs": {"data/finetune/model.pt": "m1"},
        "upstream": {"pretrain": pre},
    }
    assert prov.chain_ids(ft) == {
        "clean_train_sha256": "c1",
        "tokenizer_sha256": "t1",
        "examples_sha256": "e1",
        "pretrain_checkpoint_sha256": "l1",  # finetune read last.pt, not best.pt
        "finetune_checkpoint_sha256": "m1",
    }
    assert prov.chain_ids(pre)["pretrain_checkpoint_sha256"] == "b1"
    assert prov.chain_ids(tok) == {"clean_train_sha256": "c1", "tokenizer_sha256": "t1"}


def test_dvc_lock_upstream_names_the_stages_a_stage_reads(tmp_path):
    (tmp_path / "dvc.yaml").write_text(
        yaml.safe_dump(
            {
                "stages": {
                    "tok": {"cmd": "x", "deps": ["data/clean/train.txt"], "outs": ["data/tokenizer"]},
                    "ex": {
                        "cmd": "y",
                        "deps": ["stages/ex.py", "data/tokenizer/tokenizer.json"],
                        "outs": ["data/examples", "data/provenance/ex.json"],
                    },
                    "val": {"cmd": "z", "deps": ["data/examples"], "metrics": [{"metrics/val.json": {"cache": False}}]},
                    "tok2": {
                        "cmd": "w",
                        "deps": ["data/examples"],
                        "outs": ["data/t2", {"plots/t2.csv": {"cache": False}}],
                    },
                    "ft": {"cmd": "f", "deps": ["data/t2"], "outs": ["data/ft"]},
                    "pre": {
                        "cmd": "p",
                        "deps": ["data/examples", "metrics/val.json"],
                        "outs": [{"data/pretrain": {"persist": True}}],
                    },
                }
            }
        )
    )
    (tmp_path / "dvc.lock").write_text(
        yaml.safe_dump(
            {
                "schema": "2.0",
                "stages": {
                    "tok": {
                        "cmd": "x",
                        "deps": [{"path": "data/clean/train.txt", "md5": "c"}, {"path": "stages/tok.py", "md5": "k"}],
                        "outs": [{"path": "data/tokenizer", "md5": "t.dir"}],
                    },
                    "ex": {
                        "cmd": "y",
                        "outs": [
                            {"path": "data/examples", "md5": "e.dir"},
                            {"path": "data/provenance/ex.json", "md5": "r"},
                        ],
                    },
                    "tok2": {
                        "cmd": "w",
                        "outs": [{"path": "data/t2", "md5": "t2.dir"}, {"path": "plots/t2.csv", "md5": "p"}],
                    },
                },
            }
        )
    )
    assert prov.dvc_lock_upstream("ft", tmp_path) == {
        "tok2": {"outs": {"data/t2": "t2.dir"}, "deps": {}}
    }  # git keeps the plot
    assert prov.dvc_lock_upstream("ex", tmp_path) == {
        "tok": {"outs": {"data/tokenizer": "t.dir"}, "deps": {"data/clean/train.txt": "c"}}
    }  # not the upstream stage's code
    # only the outputs the stage reads: not the upstream record, which changes with the upstream code
    assert prov.dvc_lock_upstream("pre", tmp_path) == {
        "ex": {"outs": {"data/examples": "e.dir"}, "deps": {}},
        "val": None,
    }  # declared, not run yet
    assert prov.dvc_lock_upstream("tok", tmp_path) == {}
    assert prov.dvc_lock_upstream("nope", tmp_path) is None
    assert prov.dvc_lock_upstream("ex", tmp_path / "elsewhere") is None


def test_foreach_stages_expand_as_dvc_names_them(tmp_path):
    """``foreach`` over a params mapping or a list: one ``name@key`` stage each, ``${key}`` /
    ``${item.x}`` filled; their upstream and downstream edges are found like any stage's."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"variants": {"frozen": {"lr": 1}, "scratch": {"lr": 2}}}))
    (tmp_path / "dvc.yaml").write_text(
        yaml.safe_dump(
            {
                "stages": {
                    "ft": {"cmd": "f", "outs": ["data/ft"]},
                    "v": {
                        "foreach": "${variants}",
                        "do": {
                            "cmd": "g --variant ${key} --lr ${item.lr}",
                            "deps": ["data/ft"],
                            "outs": ["data/v/${key}", {"reports/v/${key}.json": {"cache": False}}],
                        },
                    },
                    "l": {"foreach": ["a", "b"], "do": {"cmd": "h ${item}"}},
                    "card": {"cmd": "c", "deps": ["reports/v"]},
                }
            },
            sort_keys=False,
        )
    )
    (tmp_path / "dvc.lock").write_text(
        yaml.safe_dump(
            {
                "schema": "2.0",
                "stages": {
                    "ft": {"cmd": "f", "outs": [{"path": "data/ft", "md5": "f.dir"}]},
                    "v@frozen": {
                        "cmd": "g",
                        "outs": [
                            {"path": "data/v/frozen", "md5": "v.dir"},
                            {"path": "reports/v/frozen.json", "md5": "r"},
                        ],
                    },
                },
            }
        )
    )
    stages = prov.dvc_stages(tmp_path)
    assert list(stages) == ["ft", "v@frozen", "v@scratch", "l@a", "l@b", "card"]
    assert stages["v@scratch"] == {
        "cmd": "g --variant scratch --lr 2",
        "deps": ["data/ft"],
        "outs": ["data/v/scratch", {"reports/v/scratch.json": {"cache": False}}],
    }
    assert stages["l@b"] == {"cmd": "h b"}
    assert prov.dvc_lock_upstream("v@frozen", tmp_path) == {"ft": {"outs": {"data/ft": "f.dir"}, "deps": {}}}
    assert prov.dvc_lock_upstream("card", tmp_path) == {
        "v@frozen": {"outs": {}, "deps": {}},  # it reads reports/v (git's), not data/v/frozen
        "v@scratch": None,
    }


def test_stage_run_on_a_dirty_tree_says_so_in_mlflow_and_trace(tmp_path, monkeypatch):
    """Chain and git tags on the run and its child runs; the record and trace show the dirty tree."""
    import mlflow

    from pipeline.lineage import trace, trace_render
    from stages.common import StageRun

    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "data" / "tokenizer").mkdir(parents=True)
    (tmp_path / "data" / "tokenizer" / "tokenizer.json").write_text("{}")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "c")
    (tmp_path / "code.py").write_text("x = 2\n")  # uncommitted code change
    monkeypatch.chdir(tmp_path)
    with StageRun("tokenizer", {"vocab_size": 10}) as run:
        tok = run.add_output("data/tokenizer/tokenizer.json")
        parent = mlflow.active_run()
        with mlflow.start_run(run_name="child", nested=True, experiment_id=parent.info.experiment_id) as child:
            child_id = child.info.run_id
        path = run.write_provenance()
    client = mlflow.MlflowClient()
    tags = client.get_run(run.mlflow_run_id).data.tags
    assert tags["bertrace.git_dirty"] == "True" and tags["bertrace.git_dirty_paths"] == "code.py"
    assert tags["bertrace.chain.tokenizer_sha256"] == tok
    child_tags = client.get_run(child_id).data.tags
    assert child_tags["bertrace.chain.tokenizer_sha256"] == tok and child_tags["bertrace.git_dirty"] == "True"
    assert child_tags["bertrace.git_commit"] == tags["bertrace.git_commit"]
    # the full record is an artifact of the run, equal to the file
    local = client.download_artifacts(run.mlflow_run_id, "provenance/tokenizer.json", str(tmp_path / "dl"))
    assert json.loads(Path(local).read_text()) == json.loads(path.read_text())
    # the record holds no git state (two builds of one commit write the same bytes); the run log does
    record = json.loads(path.read_text())
    assert "git" not in record and "started" not in record and "mlflow_run_id" not in record
    log = json.loads((tmp_path / "runs" / "tokenizer.json").read_text())
    assert log["git"]["dirty"] is True and log["git"]["dirty_paths"] == ["code.py"]
    assert log["record_sha256"] == tags["bertrace.record_sha256"] == prov.record_digest(record)
    assert log["mlflow_run_id"] == run.mlflow_run_id
    logged = client.download_artifacts(run.mlflow_run_id, "provenance/run.json", str(tmp_path / "dl2"))
    assert json.loads(Path(logged).read_text()) == log
    text = trace_render.format_tree(trace.lineage(path))
    assert f"tokenizer  commit {tags['bertrace.git_commit'][:12]} (dirty)" in text
    assert "uncommitted: code.py" in text and "the tree was dirty" in text
    # without the local run log (another clone), trace finds it on the tracking store by the record's digest
    (tmp_path / "runs" / "tokenizer.json").unlink()
    node = trace.lineage(path)["chain"][0]
    assert (node["mlflow_run_id"], node["git_dirty"], node["started"]) == (run.mlflow_run_id, True, log["started"])
    # and on a store that never saw the run, the record still traces, with no run shown
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")
    empty_mlflow_store(tmp_path / "other.db")
    assert trace.lineage(path)["chain"][0]["mlflow_run_id"] is None


def test_a_failure_while_opening_the_run_does_not_leave_it_running(tmp_path, monkeypatch):
    """An error after MLflow started the run but before the stage got it (logging the params) closes the
    run as FAILED instead of leaving it RUNNING (and active, which broke the next run in the process)."""
    import mlflow

    from stages.common import StageRun

    monkeypatch.chdir(tmp_path)

    def refuse(params):
        raise RuntimeError("the tracking server went away")

    monkeypatch.setattr(mlflow, "log_params", refuse)
    with pytest.raises(RuntimeError, match="went away"):
        with StageRun("clean", {"min_chars": 1}):
            pass
    assert mlflow.active_run() is None
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert [r.info.status for r in runs] == ["FAILED"]
