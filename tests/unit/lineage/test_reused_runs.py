"""The pipeline's parent MLflow run names the run that made each upstream stage's outputs DVC did
not rerun (tracking.link_reused), in a real SQLite store: found by the record's digest, as the
record a stage wrote or the one its checkpoints embed; an honest "unknown" when no run of this
store made them."""

from __future__ import annotations

import os

import pytest
from mlflow import MlflowClient

from pipeline.lineage import runlog
from pipeline.lineage.mlflow_names import mlflow_name
from pipeline.lineage.mlflow_runs import UNKNOWN_MAKER, link_reused
from pipeline.lineage.provenance import record_digest


def _record(stage: str, n: int) -> dict:
    return {"record_version": 2, "stage": stage, "params": {"n": n}, "inputs": {}, "outputs": {}, "upstream": {}}


@pytest.fixture
def client():
    return MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])  # tests/conftest.py: this test's store


def test_reused_stages_name_the_run_that_made_them(client, tmp_path):
    exp = client.create_experiment("bertrace")
    clean, pretrain, tokenizer = _record("clean", 1), _record("pretrain", 2), _record("tokenizer", 3)
    made_clean = client.create_run(exp, tags={runlog.RECORD_TAG: record_digest(clean)}).info.run_id
    made_pretrain = client.create_run(exp, tags={runlog.CHECKPOINT_RECORD_TAG: record_digest(pretrain)}).info.run_id
    parent = client.create_run(exp).info.run_id
    records = {
        "clean": {**clean, "pipeline_run_id": "earlier"},
        "pretrain": pretrain,
        "tokenizer": tokenizer,  # restored from DVC's run-cache or made in another clone: no run here
        "finetune": {**_record("finetune", 4), "pipeline_run_id": "now"},  # rerun in this pipeline run
    }
    reused = link_reused(client, parent, exp, records, "now", root=tmp_path)
    assert reused == ["clean", "pretrain", "tokenizer"]
    tags = client.get_run(parent).data.tags
    assert tags[mlflow_name("bertrace.reused.clean")] == made_clean
    assert tags[mlflow_name("bertrace.reused.pretrain")] == made_pretrain
    assert (
        tags[mlflow_name("bertrace.reused.tokenizer")]
        == UNKNOWN_MAKER
        == ("unknown: no run in this MLflow store made it (made in another clone, or restored by DVC)")
    )
    assert mlflow_name("bertrace.reused.finetune") not in tags
    note = tags["mlflow.note.content"].splitlines()
    assert f"- tokenizer: {UNKNOWN_MAKER}" in note and "logged without MLflow" not in tags["mlflow.note.content"]
    assert f"- clean: [{made_clean}](#/experiments/{exp}/runs/{made_clean})" in note
