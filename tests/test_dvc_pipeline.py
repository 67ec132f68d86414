"""End-to-end: real `dvc repro` of the data stages in a temporary copy of the repo.

Asserts what users rely on: outputs exist and chain their provenance, MLflow holds one run
per stage sharing a pipeline-run id, a second repro runs nothing, and changing a param
reruns exactly the stages downstream of it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, shared_file

pytestmark = pytest.mark.slow



def _run(cmd, cwd, env=None, check=True):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _ran(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    for item in ["pipeline", "stages", "mirrors", "params.yaml", "dvc.yaml", ".gitignore", "pyproject.toml"]:
        src = REPO / item
        if src.is_dir():
            shutil.copytree(src, root / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, root / item)
    (root / ".dvc").mkdir()
    shutil.copy2(REPO / ".dvc" / "config", root / ".dvc" / "config")
    # A small slice of the real WikiText-2 test split as the local source.
    lines = shared_file("wikitext-2-raw", "wiki.test.raw").read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "data" / "sources").mkdir(parents=True)
    (root / "data" / "sources" / "wiki.raw").write_text("".join(lines[:1500]), encoding="utf-8")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["download"]["source"] = "local"
    params["download"]["local"]["path"] = "data/sources/wiki.raw"
    params["clean"]["valid_fraction"] = 0.1
    params["tokenizer"]["vocab_size"] = 2000
    params["examples"].update(dupe_factor=2, docs_per_shard=8, workers=2)
    params["validate"]["nsp_tolerance"] = 0.1
    params["pretrain"] = _tiny_pretrain(params["pretrain"])
    params["finetune"] = _tiny_finetune(params["finetune"])
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(root)
    env.pop("MLFLOW_TRACKING_URI", None)  # the stages' default: <repo>/mlflow.db
    # Task data (SST-2) through the offline mirror of ../shared/data; the corpus is a local file.
    shared_file("sst2", "train.tsv")
    env["BERTRACE_HUB_MIRROR"] = str(REPO / "mirrors" / "shared-data.yaml")
    env["TQDM_DISABLE"] = "1"
    _run(["git", "init", "-q"], root)
    _run(["git", "add", "-A"], root)
    _run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"], root)
    first = _run(["dvc", "repro"], root, env)
    return root, env, first.stdout + first.stderr


def _tiny_pretrain(p: dict) -> dict:
    """Shrink the pre-training stage so the end-to-end run stays fast on 2 cores."""
    p = dict(p)
    p["model"] = {"preset": "tiny", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    p.update(max_steps=6, epochs=None, time_minutes=None, batch_size=8, eval_every=3, eval_batches=2,
             log_every=1, checkpoint_every=3, checkpoint_minutes=None)
    return p


def _tiny_finetune(p: dict) -> dict:
    """SST-2 through the hub mirror, a few hundred examples, one seed."""
    p = dict(p)
    p["task"] = dict(p["task"], max_examples={"train": 256, "validation": 128, "test": 128})
    p.update(epochs=1, seeds=[0], batch_size=32)
    return p


def test_first_repro_runs_every_stage_and_writes_outputs(repo):
    root, _, out = repo
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    assert _ran(out) == set(stages), out
    assert (root / "data/clean/train.txt").stat().st_size > 0
    assert (root / "data/tokenizer/vocab.txt").read_text().splitlines()[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    manifest = yaml.safe_load((root / "data/examples/manifest.json").read_text())
    assert manifest["splits"]["train"]["rows"] > 0 and manifest["splits"]["valid"]["rows"] > 0
    assert (root / "metrics/validate.json").exists()


def test_provenance_chains_back_to_the_source(repo):
    root, _, _ = repo
    import json

    examples = json.loads((root / "data/provenance/examples.json").read_text())
    tokenizer = json.loads((root / "data/provenance/tokenizer.json").read_text())
    clean = json.loads((root / "data/provenance/clean.json").read_text())
    # examples read exactly the bytes tokenizer and clean wrote
    assert examples["inputs"]["data/tokenizer/tokenizer.json"] == tokenizer["outputs"]["data/tokenizer/tokenizer.json"]
    assert examples["inputs"]["data/clean/train.txt"] == clean["outputs"]["data/clean/train.txt"]
    assert examples["upstream"]["tokenizer"]["upstream"]["clean"]["upstream"]["download"]["stage"] == "download"
    download = examples["upstream"]["clean"]["upstream"]["download"]
    assert download["inputs"]["data/sources/wiki.raw"] == __import__("hashlib").sha256(
        (root / "data/sources/wiki.raw").read_bytes()).hexdigest()
    head = _run(["git", "rev-parse", "HEAD"], root).stdout.strip()
    assert examples["git"]["commit"] == head
    assert examples["params_hash"] and examples["params"]["dupe_factor"] == 2


def test_mlflow_has_one_run_per_stage_with_a_shared_pipeline_run_id(repo):
    root, _, _ = repo
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    exp = client.get_experiment_by_name("bertrace")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    stage_runs = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]  # not the per-seed children
    seed_runs = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert {r.data.tags["bertrace.stage"] for r in seed_runs} == {"finetune"}
    by_stage = {r.data.tags["bertrace.stage"]: r for r in stage_runs}
    stages = list(yaml.safe_load((root / "dvc.yaml").read_text())["stages"])
    assert set(by_stage) == set(stages)
    assert len(stage_runs) == len(stages)  # one run per stage
    ids = {r.data.tags["bertrace.pipeline_run_id"] for r in stage_runs}
    assert len(ids) == 1, ids
    tok_sha = by_stage["tokenizer"].data.tags["bertrace.tokenizer_sha256"]
    assert by_stage["examples"].data.tags["bertrace.input.tokenizer.json"] == tok_sha
    assert by_stage["examples"].data.metrics["train.rows"] > 0


def test_second_repro_runs_nothing(repo):
    root, env, _ = repo
    out = _run(["dvc", "repro"], root, env)
    assert _ran(out.stdout + out.stderr) == set()


def _set_param(root: Path, section: str, key: str, value) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params[section][key] = value
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def _stages_from(root: Path, first: str) -> set[str]:
    """``first`` and every stage after it in dvc.yaml order (the DAG is a chain)."""
    order = list(yaml.safe_load((root / "dvc.yaml").read_text())["stages"])
    return set(order[order.index(first):])


def test_examples_param_reruns_examples_and_downstream_only(repo):
    root, env, _ = repo
    _set_param(root, "examples", "dupe_factor", 3)
    out = _run(["dvc", "repro"], root, env)
    assert _ran(out.stdout + out.stderr) == _stages_from(root, "examples")


def test_tokenizer_param_reruns_tokenizer_and_everything_after(repo):
    root, env, _ = repo
    _set_param(root, "tokenizer", "vocab_size", 1500)
    out = _run(["dvc", "repro"], root, env)
    assert _ran(out.stdout + out.stderr) == _stages_from(root, "tokenizer")
