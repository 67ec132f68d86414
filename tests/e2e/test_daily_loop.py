"""The daily loop of a DVC + MLflow user.

* Metrics designed to be read: ``dvc metrics show`` and ``dvc exp show`` of a completed run fit a
  160-column terminal with no ``…`` cell (each stage's metrics file holds the few numbers a user
  compares; every number is in ``reports/<stage>.json``).
* Sweeps that work: ``dvc exp run --queue`` + ``dvc queue start`` run the stages in a temporary
  copy under ``.dvc/tmp/exps/``, where a hub mirror's ``../../shared/data`` paths resolve from the
  original repository (``DVC_ROOT``); two queued points differ in ``dvc exp show --csv``.
* Trace recognises a DVC experiment (name, baseline, params diff) instead of calling it dirty.
* MLflow: one parent run per pipeline run, stage runs nested, reused stages linked.
* Great Expectations Data Docs show a failing expectation's unexpected values.
* Evaluate warns when predictions collapse to one class; the scorecard marks the row.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import REPO, SHARED_DATA, shared_file

WIDTH = 160
# What the README tells users to run to compare experiments (see Makefile `exps`).
# --only-changed: the params and metrics that differ between the rows; --drop: the creation time and
# the deps' hashes (every dep is a path with a "/"; params and metrics keys have none); --keep: the
# dev / test metrics even when they are equal.
EXP_SHOW = [
    "dvc",
    "exp",
    "show",
    "--no-pager",
    "--only-changed",
    "--drop",
    "Created|Executor|.*/",
    "--keep",
    "dev_|test_",
]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def _git_repo(root: Path) -> None:
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")


# ---------------------------------------------------------------------------------------------
# Paths from the repository root, wherever DVC runs the stage


def _temp_workspace(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``base/repo`` with ``base/shared/data/sst2/dev.tsv`` beside it, and a DVC temp workspace
    (a copy of the tracked files) at ``base/repo/.dvc/tmp/exps/tmp1``."""
    repo = tmp_path / "repo"
    data = tmp_path / "shared" / "data" / "sst2"
    data.mkdir(parents=True)
    (data / "dev.tsv").write_text("label\tsentence\n1\tgood\n0\tbad\n")
    mirror = "nyu-mll/glue:\n  sst2:\n    validation:\n      path: ../../shared/data/sst2/dev.tsv\n"
    workspace = repo / ".dvc" / "tmp" / "exps" / "tmp1"
    for where in (repo, workspace):
        (where / "mirrors").mkdir(parents=True)
        (where / "mirrors" / "m.yaml").write_text(mirror)
    return repo, workspace, data / "dev.tsv"


def test_mirror_paths_resolve_from_the_original_repo_in_a_dvc_temp_workspace(tmp_path, monkeypatch):
    from pipeline.core.errors import BertraceError
    from pipeline.data.hub import repo_path, resolve_mirror_entries

    repo, workspace, dev = _temp_workspace(tmp_path)
    monkeypatch.chdir(workspace)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    with pytest.raises(BertraceError, match=r"points at \.\./shared/data/sst2/dev.tsv, which does not exist"):
        resolve_mirror_entries(
            "mirrors/m.yaml", "nyu-mll/glue", "sst2", ["validation"]
        )  # a mirror entry of this config once failed to resolve

    monkeypatch.setenv("DVC_ROOT", str(repo))  # what `dvc exp run --temp` / the queue set
    found = resolve_mirror_entries("mirrors/m.yaml", "nyu-mll/glue", "sst2", ["validation"])
    assert found["validation"][0].resolve() == dev.resolve()
    assert repo_path("mirrors/m.yaml") == Path("mirrors/m.yaml")  # inside the copy: the copy's own
    assert repo_path("../x/y.tsv") == Path(os.path.normpath(repo / "../x/y.tsv"))
    assert repo_path("/abs/file") == Path("/abs/file")

    monkeypatch.chdir(repo)  # a plain `dvc repro`: DVC_ROOT is the working directory, nothing moves
    monkeypatch.setenv("DVC_ROOT", str(repo))
    assert repo_path("../shared/data/sst2/dev.tsv") == Path("../shared/data/sst2/dev.tsv")
    assert (
        resolve_mirror_entries("mirrors/m.yaml", "nyu-mll/glue", "sst2", ["validation"])["validation"][0].resolve()
        == dev.resolve()
    )


def test_mlflow_store_of_a_temp_workspace_is_the_original_repos(tmp_path, monkeypatch):
    from pipeline.lineage import mlflow_store

    repo, workspace, _ = _temp_workspace(tmp_path)
    monkeypatch.chdir(workspace)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert mlflow_store.default_tracking_uri() == f"sqlite:///{workspace.resolve()}/mlflow.db"
    monkeypatch.setenv("DVC_ROOT", str(repo))
    assert mlflow_store.default_tracking_uri() == f"sqlite:///{repo.resolve()}/mlflow.db"
    assert mlflow_store.default_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"  # explicit root


# ---------------------------------------------------------------------------------------------
# Trace recognises a DVC experiment


def test_git_state_and_trace_of_a_dvc_experiment(tmp_path, monkeypatch):
    from pipeline.lineage.runlog import git_state
    from pipeline.lineage.trace_render import format_tree

    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump({"finetune": {"lr": 0.001, "epochs": 3}, "clean": {"seed": 1}})
    )
    (tmp_path / ".gitignore").write_text(Path(REPO / ".gitignore").read_text())
    _git_repo(tmp_path)
    base = _git(tmp_path, "rev-parse", "HEAD").strip()
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump({"finetune": {"lr": 0.0005, "epochs": 3}, "clean": {"seed": 1}})
    )
    (tmp_path / "dvc_plots").mkdir()  # `dvc plots show` output: ignored, never "dirty"
    (tmp_path / "dvc_plots" / "index.html").write_text("<html/>")
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    monkeypatch.delenv("DVC_EXP_BASELINE_REV", raising=False)
    plain = git_state(tmp_path)
    assert plain["dirty"] is True and plain["dirty_paths"] == ["params.yaml"] and "experiment" not in plain

    monkeypatch.setenv("DVC_EXP_NAME", "lean-pita")
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", base)
    state = git_state(tmp_path)
    assert state["dirty"] is False and state["dirty_paths"] == []
    exp = state["experiment"]
    assert exp == {
        "name": "lean-pita",
        "baseline_rev": base,
        "ref": f"refs/exps/{base[:2]}/{base[2:]}/lean-pita",
        "params_diff": {"finetune.lr": [0.001, 0.0005]},
        "changed_paths": ["params.yaml"],
    }

    record = {"stage": "finetune", "git": state, "params_hash": "p" * 64, "finished": "2026-01-01T00:00:00+00:00"}
    lin = {
        "target": "data/finetune/model.pt",
        "kind": "checkpoint",
        "target_sha256": "a" * 64,
        "checks": [],
        "chain": [
            {
                "stage": "finetune",
                "git_commit": base,
                "git_dirty": False,
                "dirty_paths": [],
                "experiment": exp,
                "params_hash": "p" * 64,
                "finished": record["finished"],
                "inputs": {},
                "outputs": {},
                "dvc_outs": {},
            }
        ],
    }
    text = format_tree(lin)
    assert f"DVC experiment lean-pita (baseline {base[:10]}): finetune.lr 0.001 -> 0.0005" in text
    assert "(dirty)" not in text and "uncommitted" not in text
    assert "reproduce: dvc exp apply lean-pita && dvc repro" in text and f"refs/exps/{base[:2]}/" in text


# ---------------------------------------------------------------------------------------------
# Evaluate: collapsed predictions


def test_collapsed_predictions_warn_in_the_report_and_mark_the_scorecard_row():
    from pipeline.evaluate.report import collapse_warnings, evaluate_logits, render_report
    from pipeline.reports.scorecard_md import render_scorecard

    labels = np.array([0] * 55 + [1] * 45)
    one_class = np.tile([2.0, -1.0], (100, 1))  # always "negative"
    results = {"validation": evaluate_logits(one_class, labels, ["negative", "positive"])}
    warnings = collapse_warnings(results)
    assert warnings == [
        "validation: every prediction is 'negative' (predictions collapsed to one class; "
        "accuracy 55.0 %, macro F1 35.5 %)"
    ]
    # not collapsed, but no better than the majority class (55 %): 55.5 % is within 1 point
    near = np.where(np.arange(100)[:, None] < 99, one_class, one_class[:, ::-1])
    near[-1] = [-1.0, 2.0]  # one "positive" prediction, on a positive example
    res = {"test": evaluate_logits(near, labels, ["negative", "positive"])}
    assert res["test"]["accuracy"] == pytest.approx(0.56)
    assert collapse_warnings(res) == [
        "test: accuracy 56.0 % is within 1 point of always predicting the majority class (55.0 %)"
    ]
    good = np.where(labels[:, None] == 0, one_class, one_class[:, ::-1])
    assert collapse_warnings({"validation": evaluate_logits(good, labels, ["negative", "positive"])}) == []

    report = render_report(results, checkpoint={"path": "m.pt"}, warnings=warnings)
    assert "> **Warning** — validation: every prediction is 'negative'" in report
    row = {"name": "run", "dev_mean": 55.0, "dev_std": 0.0, "seeds": 1, "warning": "; ".join(warnings)}
    ok = {"name": "other", "dev_mean": 80.0, "dev_std": 0.5, "seeds": 3}
    md = render_scorecard([row, ok])
    assert "| run | — | — | none | ⚠ **55.00** ± 0.00 (1 seed)" in md
    assert "| other | — | — | none | **80.00** ± 0.50 (3 seeds)" in md
    assert "- ⚠ **run**: validation: every prediction is 'negative'" in md


# ---------------------------------------------------------------------------------------------
# Metrics files: the few numbers


def test_metrics_summaries_hold_the_few_numbers_a_user_compares():
    from pipeline.evaluate.report import evaluation_summary
    from stages.pretrain import metrics_summary as pretrain_summary

    details = {
        "tokens_seen": 1000,
        "val_loss": 6.8,
        "val_mlm_acc": 0.15,
        "val_nsp_acc": 0.76,
        "val_mlm_loss": 6.3,
        "step": 10,
        "lr": 1e-4,
        "model_sha256": "x" * 64,
    }
    assert pretrain_summary(details) == {
        "tokens": 1000,
        "val_loss": 6.8,
        "mlm_acc": 0.15,
        "nsp_acc": 0.76,
    }  # no throughput: it differs on every rebuild (the run log's timings)
    results = {
        "validation": {"accuracy": 0.83, "macro_f1": 0.82, "n": 872},
        "test": {"accuracy": 0.81, "macro_f1": 0.8},
    }
    assert evaluation_summary(results) == {"dev_f1": 0.82, "test_acc": 0.81, "test_f1": 0.8}


# ---------------------------------------------------------------------------------------------
# MLflow: one parent run per pipeline run


def _stage(stage: str, pipeline_id: str, metrics: dict, monkeypatch) -> str:
    from stages.common import StageRun

    monkeypatch.setenv("BERTRACE_PIPELINE_RUN_ID", pipeline_id)
    with StageRun(stage, {"seed": 1, "stage": stage}) as run:
        if (Path("data/provenance") / "a.json").exists():
            run.add_upstream("a")
        run.write_metrics(metrics)
        run.write_provenance()
    return run.mlflow_run_id


def test_one_parent_run_per_pipeline_run_with_stage_runs_nested_and_reused_stages_linked(tmp_path, monkeypatch):
    import mlflow

    from pipeline.lineage.mlflow_runs import KIND_TAG, PIPELINE_TAG

    monkeypatch.chdir(tmp_path)
    (tmp_path / "dvc.yaml").write_text(
        yaml.safe_dump(
            {
                "stages": {
                    "a": {"cmd": "a", "outs": ["data/a.txt"], "metrics": [{"metrics/a.json": {"cache": False}}]},
                    "b": {"cmd": "b", "deps": ["data/a.txt"], "metrics": [{"metrics/b.json": {"cache": False}}]},
                }
            }
        )
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a")
    (tmp_path / "dvc.lock").write_text(
        yaml.safe_dump(
            {"schema": "2.0", "stages": {"a": {"cmd": "a", "outs": [{"path": "data/a.txt", "md5": "0" * 32}]}}}
        )
    )
    # pipeline run 1: both stages; pipeline run 2: DVC skipped `a` (its outputs are from run 1)
    a1 = _stage("a", "pipe-1", {"rows": 10}, monkeypatch)
    b1 = _stage("b", "pipe-1", {"dev_acc": 0.5}, monkeypatch)
    b2 = _stage("b", "pipe-2", {"dev_acc": 0.75}, monkeypatch)

    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name("bertrace").experiment_id
    parents = {
        r.data.tags[PIPELINE_TAG]: r for r in client.search_runs([exp], filter_string=f"tags.`{KIND_TAG}` = 'pipeline'")
    }
    assert set(parents) == {"pipe-1", "pipe-2"}
    p1, p2 = parents["pipe-1"], parents["pipe-2"]
    for rid, parent in ((a1, p1), (b1, p1), (b2, p2)):
        tags = client.get_run(rid).data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id and tags[KIND_TAG] == "stage"
    # side by side: each parent holds every stage's params and metrics, the reused stage's too
    assert p1.data.metrics == {"a.rows": 10.0, "b.dev_acc": 0.5}
    assert p2.data.metrics == {"a.rows": 10.0, "b.dev_acc": 0.75}
    assert p2.data.params == {"a.seed": "1", "a.stage": "a", "b.seed": "1", "b.stage": "b"}
    assert p2.data.tags["bertrace.reused.a"] == a1 and "bertrace.reused.a" not in p1.data.tags
    assert f"- a: [{a1}](#/experiments/{exp}/runs/{a1})" in p2.data.tags["mlflow.note.content"]
    assert {p1.info.status, p2.info.status} == {"FINISHED"}

    monkeypatch.delenv("BERTRACE_PIPELINE_RUN_ID")  # a stage on its own (no DVC): a top-level run
    monkeypatch.delenv("DVC_STAGE", raising=False)
    from stages.common import StageRun

    with StageRun("b", {}) as alone:
        pass
    assert "mlflow.parentRunId" not in client.get_run(alone.mlflow_run_id).data.tags


# ---------------------------------------------------------------------------------------------
# Great Expectations Data Docs


def test_data_docs_page_of_a_corrupted_shard_shows_the_failing_expectation_and_its_values(tmp_path):
    from pipeline.checks.gx import build_data_docs
    from pipeline.checks.validate_shards import validate_shards
    from tests.support.shards import VOCAB, rewrite, unmasked, write_examples

    examples = write_examples(tmp_path / "examples")

    def plant(rows):
        rows[11]["input_ids"][unmasked(rows[11])] = VOCAB + 5

    rewrite(examples, "valid/shard-00000.parquet", plant)
    report = validate_shards(examples)
    assert not report.success
    index = build_data_docs(report.gx_results, tmp_path / "reports" / "data_docs")
    assert index.is_file()
    pages = sorted((tmp_path / "reports" / "data_docs" / "validations").rglob("*.html"))
    failing = [p for p in pages if "valid\u2215shard-00000.parquet" in str(p) and "shard rows" in str(p)]
    assert len(failing) == 1, pages
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", failing[0].read_text(encoding="utf-8")))
    assert "Status: Failed" in text
    # the failing expectation (column max_token_id, "all input ids" in range) and the sampled bad value
    assert re.search(
        rf"max_token_id Status Expectation Observed Value all input ids 1 unexpected values found\. "
        rf".* Unexpected Value Count {VOCAB + 5} 1",
        text,
    ), text[:3000]
    # passing shards add no page of their own: failures plus one page per suite
    assert len(pages) == len({p.parts[-4] for p in pages}) + 1
    assert "shard-00000.parquet" in index.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# End to end: a tiny repo, `dvc repro`, table widths, a queued 2-point sweep


def _run(cmd, cwd, env, check=True, timeout=900):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A tiny copy of the repo (tests/e2e/test_dvc_pipeline.py's params) beside a link to the shared data,
    so that mirrors/shared-data.yaml's ``../../shared/data`` resolves; finetune.mirror points at it."""
    from tests.support.repos import copy_repo, tiny_params

    shared_file("sst2", "dev.tsv")
    base = tmp_path_factory.mktemp("daily")
    root = base / "repo"
    root.mkdir()
    (base / "shared").symlink_to(SHARED_DATA.parent, target_is_directory=True)
    copy_repo(root)
    params = tiny_params(yaml.safe_load((root / "params.yaml").read_text()))
    params["finetune_variants"] = {}  # the frozen / scratch stages: tests/e2e/test_dvc_pipeline.py
    params["finetune"]["mirror"] = "mirrors/shared-data.yaml"  # relative, as a user writes it
    params["evaluate"]["log_model"] = False
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(root)
    for key in ("MLFLOW_TRACKING_URI", "BERTRACE_HUB_MIRROR", "BERTRACE_PIPELINE_RUN_ID", "DVC_ROOT", "DVC_EXP_NAME"):
        env.pop(key, None)
    env["TQDM_DISABLE"] = "1"
    _git_repo(root)
    _run(["dvc", "repro"], root, env)
    _git(root, "add", "-A")
    _git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "a completed run")
    return root, env


def _width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def _cells(text: str) -> list[str]:
    return [c.strip() for line in text.splitlines() for c in re.split(r"\s{2,}|│|\|", line) if c.strip()]


@pytest.mark.slow
def test_metrics_show_and_exp_show_fit_160_columns(repo):
    root, env = repo
    env = {**env, "COLUMNS": str(WIDTH)}
    shown = _run(["dvc", "metrics", "show"], root, env).stdout
    assert _width(shown) <= WIDTH, shown
    files = {line.split()[0] for line in shown.splitlines()[1:] if line.strip()}
    assert files == {"metrics/validate.json", "metrics/pretrain.json", "metrics/finetune.json", "metrics/eval.json"}
    keys = [k for f in sorted(files) for k in json.loads((root / f).read_text())]
    assert len(keys) == len(set(keys)), keys  # a shared key would show as "<path>:<key>" in dvc exp show
    header = shown.splitlines()[0].split()
    assert {"dev_acc", "dev_std", "test_acc", "val_loss", "passed", "failed"} <= set(header), header
    assert "tok_per_s" not in header  # a time: not in any output
    assert {"mlm_acc", "nsp_acc"} <= set(header), header  # the default objective's (mlm_nsp) accuracies
    # every number is still there, in the reports
    details = json.loads((root / "reports/finetune.json").read_text())
    assert set(details["per_seed"]) == {"0"} and "validation_accuracy" in details
    assert "by_expectation" in json.loads((root / "reports/validate.json").read_text())
    # validate's Great Expectations Data Docs: a DVC output, and artifacts of its MLflow run
    assert (root / "reports/data_docs/index.html").is_file()
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{root}/mlflow.db")
    (validate,) = client.search_runs(
        [client.get_experiment_by_name("bertrace").experiment_id], filter_string="tags.`bertrace.stage` = 'validate'"
    )
    assert "data_docs/index.html" in {a.path for a in client.list_artifacts(validate.info.run_id, "data_docs")}

    table = _run(EXP_SHOW, root, env).stdout
    assert _width(table) <= WIDTH, table
    assert "…" not in _cells(table), table
    assert "workspace" in table and "dev_acc" in table and "test_acc" in table
    everything = _run(["dvc", "exp", "show", "--no-pager", "--drop", "Created|.*/|[a-z_]+\\."], root, env).stdout
    assert _width(everything) <= WIDTH and "…" not in _cells(everything), everything  # all metrics, no params
    assert "dev_acc" in everything and "test_acc" in everything


def _queued(root: Path, env: dict, name: str, *sets: str) -> None:
    _run(["dvc", "exp", "run", "--queue", "-n", name, *[a for s in sets for a in ("-S", s)]], root, env)


@pytest.mark.slow
def test_queued_sweep_runs_in_temp_workspaces_and_compares_in_exp_show(repo):
    """Two points of a fine-tuning sweep through DVC's queue (temp workspaces under .dvc/tmp/exps,
    the mirror's relative paths resolving from the repo), compared with `dvc exp show --csv`; trace
    of an applied experiment names it; MLflow has one parent per experiment with the reused stages."""
    import mlflow

    root, env = repo
    _queued(root, env, "lr-low", "finetune.lr=1e-05", "finetune.epochs=1")
    _queued(root, env, "lr-high", "finetune.lr=0.003", "finetune.epochs=1")
    _run(["dvc", "queue", "start", "-j", "1"], root, env)
    deadline = time.time() + 600
    while time.time() < deadline:
        status = _run(["dvc", "queue", "status"], root, env).stdout
        if not re.search(r"\b(Queued|Running)\b", status):
            break
        time.sleep(3)
    _run(["dvc", "queue", "stop"], root, env, check=False)
    assert "Failed" not in status, (
        status + "\n" + _run(["dvc", "queue", "logs", "lr-high"], root, env, check=False).stdout
    )

    rows = list(csv.DictReader(io.StringIO(_run(["dvc", "exp", "show", "--csv"], root, env).stdout)))
    by_name = {r["Experiment"]: r for r in rows if r["Experiment"] in ("lr-low", "lr-high")}
    assert set(by_name) == {"lr-low", "lr-high"}, rows
    low, high = by_name["lr-low"], by_name["lr-high"]
    assert (float(low["finetune.lr"]), float(high["finetune.lr"])) == (1e-05, 0.003)
    for r in (low, high):
        assert 0.0 < float(r["dev_acc"]) < 1.0 and r["test_acc"] and r["mlm_acc"]
    assert low["mlm_acc"] == high["mlm_acc"] and low["passed"] == high["passed"]  # upstream stages not rerun
    table = _run([*EXP_SHOW, "--md"], root, {**env, "COLUMNS": str(WIDTH)}).stdout
    assert _width(table) <= WIDTH and "lr-low" in table and "lr-high" in table, table

    client = mlflow.MlflowClient(f"sqlite:///{root}/mlflow.db")  # the repo's store, not the temp copies'
    exp = client.get_experiment_by_name("bertrace").experiment_id
    parents = client.search_runs(
        [exp], filter_string="tags.`bertrace.dvc_experiment` = 'lr-high' and tags.`bertrace.run_kind` = 'pipeline'"
    )
    assert len(parents) == 1
    parent = parents[0]
    stages = client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(r.data.tags["bertrace.stage"] for r in stages) == ["evaluate", "finetune"]
    assert {"bertrace.reused.pretrain", "bertrace.reused.tokenizer", "bertrace.reused.examples"} <= set(
        parent.data.tags
    )
    assert parent.data.params["finetune.lr"] == "0.003" and "finetune.dev_acc" in parent.data.metrics
    assert parent.data.metrics["pretrain.mlm_acc"] == pytest.approx(float(high["mlm_acc"]))  # a reused stage's numbers
    # the learning rate shows in training (the tiny model's dev predictions may well be one class in both)
    losses = {}
    for name in ("lr-low", "lr-high"):
        (run,) = client.search_runs(
            [exp],
            filter_string=f"tags.`bertrace.dvc_experiment` = '{name}' and "
            "tags.`bertrace.stage` = 'finetune' and tags.`bertrace.run_kind` = 'stage'",
        )
        losses[name] = run.data.metrics["per_seed.0.train_loss"]
    assert losses["lr-low"] != losses["lr-high"], losses

    _run(["dvc", "exp", "apply", "lr-high"], root, env)
    # a queued experiment ran in a temp copy: its run log stayed there, and MLflow has it (the run is
    # tagged with the digest of the record the checkpoint embeds)
    traced = _run([sys.executable, "-m", "stages.cli", "trace", "data/finetune/model.pt", "--json"], root, env).stdout
    node = next(n for n in json.loads(traced)["chain"] if n["stage"] == "finetune")
    assert node["git_dirty"] is False and node["experiment"]["name"] == "lr-high", node
    assert node["experiment"]["params_diff"]["finetune.lr"] == [params_lr(root), 0.003]
    out = _run([sys.executable, "-m", "stages.cli", "trace", "data/finetune/model.pt"], root, env).stdout
    assert "DVC experiment lr-high (baseline " in out and "reproduce: dvc exp apply lr-high" in out, out
    assert "(dirty)" not in out.split("└─ finetune")[1].splitlines()[0]


def params_lr(root: Path) -> float:
    """finetune.lr of the baseline commit."""
    return yaml.safe_load(_git(root, "show", "HEAD:params.yaml"))["finetune"]["lr"]


def test_data_docs_are_the_same_bytes_in_any_time_zone(tmp_path, monkeypatch):
    """The site is a DVC output: GX renders run times in the local zone, bertrace renders in UTC."""
    import time

    from pipeline.checks.gx import build_data_docs
    from pipeline.checks.validate_shards import validate_shards
    from pipeline.core.io import sha256_file
    from tests.support.shards import write_examples

    report = validate_shards(write_examples(tmp_path / "examples"))
    sites = {}
    for zone in ("UTC", "Asia/Kolkata"):
        monkeypatch.setenv("TZ", zone)
        time.tzset()
        site = tmp_path / zone.replace("/", "-")
        build_data_docs(report.gx_results, site)
        sites[zone] = {p.relative_to(site).as_posix(): sha256_file(p) for p in site.rglob("*") if p.is_file()}
        assert time.strftime("%Z") == ("UTC" if zone == "UTC" else "IST")  # the zone is the caller's again
    monkeypatch.delenv("TZ")
    time.tzset()
    assert sites["UTC"] == sites["Asia/Kolkata"]
