"""A team on shared servers, end to end (docs/team.md): real SeaweedFS S3 as the DVC remote and
MLflow's artifact store, a real MLflow tracking server on PostgreSQL (tests/support/servers.py).

One module fixture starts the servers and lets two clones of a small DAG (tests/support/dag.py) build it
*at the same time* against them (clone A and clone D: two teammates). A commits its dvc.lock and
``dvc push --run-cache``es. The tests then act as the rest of the team:

* clone B (``git clone`` of A, its own DVC cache) pulls: clean status, nothing to rerun, a
  ``trace --verify`` of the fine-tuned model that is all ``ok``, no path of A's machine anywhere;
* clone C changes one finetune param and ``dvc repro --pull``s: pre-training is pulled, only the
  stages downstream of the change run;
* a shared directory (an NFS share) as the remote works the same way, without S3;
* the server holds one parent run per pipeline run with a nested run per stage; ``trace`` resolves
  ``runs:/`` and ``models:/`` and the pyfunc model loads from the server's artifact store;
* a tracking server that is down: one line naming MLFLOW_TRACKING_URI, exit 2, outputs intact;
* scripts/ci-data-checks.sh: green on the pushed shards, red (naming shard and expectation)
  after a shard object in the remote is rewritten;
* the S3 secret key is in no record, run log, trace, repro log, MLflow param, tag or artifact.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.lineage.provenance import dvc_paths
from tests.support.dag import dag_env, link_shared, run, template_repo
from tests.support.servers import team_servers

pytestmark = pytest.mark.slow

DATA_STAGES = {"download", "clean", "tokenizer", "examples", "validate"}
REPORT_STAGES = {"scorecard", "plots"}  # render files from the others' outputs: no MLflow run of their own
GIT_ID = ["-c", "user.name=t", "-c", "user.email=t@t"]


def _ran(proc: subprocess.CompletedProcess | str) -> set[str]:
    """The stages a `dvc repro` ran, from its output."""
    text = proc if isinstance(proc, str) else proc.stdout + proc.stderr
    return set(re.findall(r"Running stage '([^']+)'", text))


def _files(root: Path) -> dict[str, str]:
    """sha256 of every file under root's DVC outputs (the workspace, not the cache)."""
    stages = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    out = {}
    for entry in stages.values():
        for o in entry.get("outs") or []:
            p = root / o["path"]
            for f in sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]:
                if f.is_file():
                    out[f.relative_to(root).as_posix()] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


class Team:
    """The servers and the clones of one module."""

    def __init__(self, base: Path, info: dict):
        self.base, self.info = base, info
        self.secret = info["credentials"]["secret_key"]
        self.logs: list[str] = []  # stdout + stderr of every command, for the secrets grep

    def env(self, root: Path, **extra) -> dict[str, str]:
        """dag_env + the servers' variables; extra overrides them ("" unsets)."""
        env = {**dag_env(root), **self.info["env"], **extra}
        return {k: v for k, v in env.items() if v != ""}

    def run(self, cmd: list[str], root: Path, check: bool = True, **extra) -> subprocess.CompletedProcess:
        proc = subprocess.run(cmd, cwd=root, env=self.env(root, **extra), capture_output=True, text=True)
        self.logs.append(proc.stdout + proc.stderr)
        if check and proc.returncode != 0:
            raise AssertionError(f"{cmd} in {root} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def clone(self, src: Path, name: str) -> Path:
        dst = self.base / name / "repo"
        dst.parent.mkdir()
        run(["git", "clone", "-q", str(src), str(dst)], self.base)
        link_shared(dst)
        return dst

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.info["urls"]["mlflow"])


@pytest.fixture(scope="module")
def team_dag(tmp_path_factory):
    base = tmp_path_factory.mktemp("team")
    with team_servers(base / "servers") as info:
        t = Team(base, info)
        template = template_repo(base / "template" / "repo")
        run(["dvc", "remote", "add", "-d", "team", "s3://dvc/bertrace"], template)
        run(["git", *GIT_ID, "commit", "-qam", "the team's remote"], template)
        t.a, t.d = t.clone(template, "a"), t.clone(template, "d")
        t0 = time.perf_counter()
        procs = {
            root: subprocess.Popen(
                ["dvc", "repro"], cwd=root, env=t.env(root), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            for root in (t.a, t.d)
        }
        t.repro = {}
        for root, proc in procs.items():
            out = proc.communicate()[0]
            t.logs.append(out)
            assert proc.returncode == 0, f"dvc repro in {root} failed:\n{out}"
            t.repro[root] = out
        t.build_seconds = time.perf_counter() - t0
        run(["git", "add", "-A"], t.a)
        run(["git", *GIT_ID, "commit", "-qm", "a's run"], t.a)
        t0 = time.perf_counter()
        t.run(["dvc", "push", "--run-cache"], t.a)
        t.push_seconds = time.perf_counter() - t0
        yield t


def test_two_clones_at_once_each_one_parent_run_with_nested_stage_runs(team_dag):
    from pipeline.lineage.provenance import dvc_stages

    t = team_dag
    stages = set(dvc_stages(t.a))
    assert all(_ran(out) == stages for out in t.repro.values())
    client = t.client()
    exps = [e.experiment_id for e in client.search_experiments()]
    parents = client.search_runs(exps, filter_string="tags.`bertrace.run_kind` = 'pipeline'")
    assert len(parents) == 2, [p.info.run_name for p in parents]
    for parent in parents:
        children = client.search_runs(exps, filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
        assert {c.data.tags["bertrace.stage"] for c in children} == stages - REPORT_STAGES, parent.info.run_name
        assert {c.data.tags["bertrace.pipeline_run_id"] for c in children} == {parent.data.tags["bertrace.pipeline"]}
        assert all(c.info.status == "FINISHED" for c in children)
    assert len({p.data.tags["bertrace.pipeline"] for p in parents}) == 2
    print(
        f"\nteam: two clones built the DAG at once in {t.build_seconds:.0f} s; dvc push --run-cache "
        f"{t.push_seconds:.1f} s"
    )


def test_clone_b_pulls_and_has_nothing_to_rerun(team_dag):
    t = team_dag
    b = t.clone(t.a, "b")
    assert not (b / "data" / "pretrain").exists()
    t0 = time.perf_counter()
    t.run(["dvc", "pull"], b)
    pull_seconds = time.perf_counter() - t0
    assert _files(b) == _files(t.a)
    status = t.run(["dvc", "status"], b)
    assert "Data and pipelines are up to date" in status.stdout, status.stdout
    again = t.run(["dvc", "repro"], b)
    assert _ran(again) == set(), again.stdout
    trace = t.run([sys.executable, "-m", "stages.cli", "trace", "data/finetune/model.pt", "--verify"], b)
    text = trace.stdout + trace.stderr
    verify = re.search(r"^verify: (\d+) ok, (\d+) changed, (\d+) not present", text, flags=re.M)
    assert verify and int(verify[1]) > 20 and verify.groups()[1:] == ("0", "0"), text
    # when and where each stage ran: from the tracking server (B has no run logs of its own)
    assert not (b / "runs").exists()
    assert len(re.findall(r"finished \d{4}-\d\d-\d\dT", text)) >= 6, text
    # nothing of clone A's machine (its paths) in B's records, reports, traces or MLflow tags
    a_paths = {str(t.a), str(t.a.parent), str(t.d)}
    for f in [
        *(b / "data" / "provenance").glob("*.json"),
        *(b / "reports").glob("*.json"),
        *(b / "reports").glob("*.md"),
    ]:
        text_f = f.read_text(encoding="utf-8")
        assert not [p for p in a_paths if p in text_f], f
    assert not [p for p in a_paths if p in text], text
    client = t.client()
    exps = [e.experiment_id for e in client.search_experiments()]
    for r in client.search_runs(exps):
        for k, v in r.data.tags.items():
            assert not [p for p in a_paths | {str(t.base)} if p in v], (r.info.run_name, k, v)
    print(f"\nteam: dvc pull of the tiny DAG's outputs {pull_seconds:.1f} s")


def test_clone_c_changes_finetune_and_pulls_pretraining(team_dag):
    from pipeline.lineage.provenance import dvc_stages

    t = team_dag
    c = t.clone(t.a, "c")
    # C names the endpoint in its .dvc/config.local (the other clones use AWS_ENDPOINT_URL)
    run(["dvc", "remote", "modify", "--local", "team", "endpointurl", t.info["urls"]["s3"]], c)
    params = yaml.safe_load((c / "params.yaml").read_text())
    params["finetune"]["lr"] = float(params["finetune"]["lr"]) * 0.5
    (c / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = t.run(["dvc", "repro", "--pull"], c, AWS_ENDPOINT_URL="")
    ran = _ran(proc)
    stages = dvc_stages(c)
    # expected: the stages that read the finetune params section, and everything downstream of them
    expected = {s for s, spec in stages.items() if "finetune" in dvc_paths(spec.get("params"))}
    while True:
        made = {o for s in expected for o in dvc_paths(stages[s].get("outs"))}
        more = {
            s
            for s, spec in stages.items()
            if s not in expected
            and any(d == m or d.startswith(m + "/") for d in dvc_paths(spec.get("deps")) for m in made)
        }
        if not more:
            break
        expected |= more
    print(f"\nteam: after a finetune.lr change, dvc repro --pull ran {sorted(ran)}")
    assert "finetune" in ran and not ran & (DATA_STAGES | {"pretrain"}), proc.stdout
    assert ran == expected, (sorted(ran), sorted(expected))
    lock_c = yaml.safe_load((c / "dvc.lock").read_text())["stages"]
    lock_a = yaml.safe_load((t.a / "dvc.lock").read_text())["stages"]
    assert lock_c["pretrain"] == lock_a["pretrain"]
    assert {k: v for k, v in _files(c).items() if k.startswith("data/pretrain/")} == {
        k: v for k, v in _files(t.a).items() if k.startswith("data/pretrain/")
    }


def test_a_shared_directory_remote_works_the_same_way(team_dag):
    """An NFS share as the remote (docs/team.md): push there, a clone pulls from it with no S3 at all."""
    t = team_dag
    share = t.base / "nfs-share" / "bertrace-dvc"
    run(["dvc", "remote", "add", "--local", "share", str(share)], t.a)
    t.run(["dvc", "push", "--run-cache", "-r", "share"], t.a)
    e = t.clone(t.a, "e")
    run(["dvc", "remote", "add", "--local", "--default", "share", str(share)], e)
    no_s3 = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_ENDPOINT_URL": ""}
    t.run(["dvc", "pull"], e, **no_s3)
    assert _files(e) == _files(t.a)
    assert "Data and pipelines are up to date" in t.run(["dvc", "status"], e, **no_s3).stdout


def _last_pipeline_stage_run(t: Team, stage: str):
    client = t.client()
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(
        exps, filter_string=f"tags.`bertrace.stage` = '{stage}'", order_by=["attributes.start_time DESC"]
    )
    assert runs, stage
    return client, exps, runs[0]


def test_trace_resolves_runs_and_models_uris_and_the_model_loads_from_the_server(team_dag, tmp_path):
    t = team_dag
    client, exps, ev = _last_pipeline_stage_run(t, "evaluate")
    models = client.search_logged_models(experiment_ids=exps)
    mine = [m for m in models if m.source_run_id == ev.info.run_id]
    assert mine, [m.source_run_id for m in models]
    for target in (f"runs:/{ev.info.run_id}/model", f"models:/{mine[0].model_id}"):
        out = t.run([sys.executable, "-m", "stages.cli", "trace", target], t.a)
        assert "pretrain" in out.stdout and "finetune" in out.stdout, out.stdout
    code = f"""
import mlflow, pandas as pd
m = mlflow.pyfunc.load_model("runs:/{ev.info.run_id}/model")
print(m.predict(pd.DataFrame({{"sentence": ["a fine film", "a dull and tedious mess"]}})).to_json())
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # the server proxies artifacts
    env["MLFLOW_TRACKING_URI"] = t.info["urls"]["mlflow"]
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    predictions = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(next(iter(predictions.values()))) == 2, predictions


def test_server_down_is_one_line_exit_2_and_no_output_lost(team_dag):
    t = team_dag
    b = t.base / "b" / "repo"
    if not b.exists():
        pytest.skip("needs clone B (test_clone_b_pulls_and_has_nothing_to_rerun)")
    before, lock = _files(b), (b / "dvc.lock").read_bytes()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens: connection refused
    # make repro's first step: fails before DVC removes anything
    check = t.run([sys.executable, "-m", "stages.cli", "check-tracking"], b, check=False, MLFLOW_TRACKING_URI=dead)
    assert check.returncode == 2, check.stdout + check.stderr
    assert check.stderr.strip().splitlines() == [check.stderr.strip()]
    assert check.stderr.startswith(f"error: MLFLOW_TRACKING_URI={dead}: no MLflow server answers"), check.stderr
    assert _files(b) == before
    # plain `dvc repro`: the stage fails in its first second, naming how to get the removed outputs back
    proc = t.run(["dvc", "repro", "--force", "--single-item", "evaluate"], b, check=False, MLFLOW_TRACKING_URI=dead)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: MLFLOW_TRACKING_URI={dead}"), text
    assert "`dvc checkout evaluate` puts them back" in errors[0], errors[0]
    assert "Traceback" not in text
    assert (b / "dvc.lock").read_bytes() == lock
    uncached = re.search(r"`git checkout -- ([^`]+)`", errors[0])
    t.run(["dvc", "checkout", "evaluate"], b)
    if uncached:
        run(["git", "checkout", "--", *uncached[1].split()], b)
    assert _files(b) == before
    assert "Data and pipelines are up to date" in t.run(["dvc", "status"], b).stdout


def _shard_key(root: Path, rel: str) -> str:
    md5 = hashlib.md5((root / rel).read_bytes()).hexdigest()
    return f"bertrace/files/md5/{md5[:2]}/{md5[2:]}"


def test_ci_data_checks_green_then_red_after_a_shard_is_rewritten(team_dag):
    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq
    from botocore.config import Config

    t = team_dag
    script = ["bash", "scripts/ci-data-checks.sh", "--no-install", "ci_docs"]
    good = t.clone(t.a, "ci-good")
    ok = t.run(script, good, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert (good / "ci_docs" / "index.html").is_file()
    assert (good / "data" / "examples" / "manifest.json").is_file() and not (good / "data" / "pretrain").exists()

    shard = sorted((t.a / "data" / "examples" / "train").glob("shard-*.parquet"))[0]
    rel = shard.relative_to(t.a).as_posix()
    table = pq.read_table(shard)
    labels = table.column("next_sentence_label").to_pylist()
    labels[0] = 7
    bad = table.set_column(
        table.schema.get_field_index("next_sentence_label"),
        "next_sentence_label",
        pa.array(labels, type=table.schema.field("next_sentence_label").type),
    )
    buf = io.BytesIO()
    pq.write_table(bad, buf)
    s3 = boto3.client(
        "s3",
        endpoint_url=t.info["urls"]["s3"],
        region_name="us-east-1",
        aws_access_key_id=t.info["credentials"]["access_key"],
        aws_secret_access_key=t.secret,
        config=Config(s3={"addressing_style": "path"}),
    )
    key = _shard_key(t.a, rel)
    original = s3.get_object(Bucket="dvc", Key=key)["Body"].read()
    assert original == shard.read_bytes()
    s3.put_object(Bucket="dvc", Key=key, Body=buf.getvalue())
    try:
        red = t.clone(t.a, "ci-red")
        fail = t.run(script, red, check=False)
    finally:
        s3.put_object(Bucket="dvc", Key=key, Body=original)
    text = fail.stdout + fail.stderr
    assert fail.returncode == 1, text
    lines = text.splitlines()
    failing = [lines[i + 1].strip() for i, line in enumerate(lines[:-1]) if line == f"FAIL {rel}"]
    assert "expectation: expect_column_values_to_be_in_set(next_sentence_label)" in failing, text
    assert (red / "ci_docs" / "index.html").is_file()


def test_secret_key_is_nowhere(team_dag):
    import boto3
    from botocore.config import Config

    t = team_dag
    secret = t.secret.encode()
    leaks = []
    for clone in sorted(p for p in t.base.iterdir() if (p / "repo").is_dir()):
        for f in (clone / "repo").rglob("*"):
            rel = f.relative_to(clone / "repo").parts
            if f.is_file() and rel[0] != ".git" and rel[:2] != (".dvc", "cache"):
                if secret in f.read_bytes():
                    leaks.append(str(f))
    leaks += [f"log {i}" for i, log in enumerate(t.logs) if t.secret in log]
    client = t.client()
    exps = [e.experiment_id for e in client.search_experiments()]
    for r in client.search_runs(exps):
        for kind, values in (("param", r.data.params), ("tag", r.data.tags)):
            leaks += [f"run {r.info.run_name} {kind} {k}" for k, v in values.items() if t.secret in str(v)]
    s3 = boto3.client(
        "s3",
        endpoint_url=t.info["urls"]["s3"],
        region_name="us-east-1",
        aws_access_key_id=t.info["credentials"]["access_key"],
        aws_secret_access_key=t.secret,
        config=Config(s3={"addressing_style": "path"}),
    )
    n = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket="mlflow"):
        for obj in page.get("Contents", []):
            n += 1
            if secret in s3.get_object(Bucket="mlflow", Key=obj["Key"])["Body"].read():
                leaks.append(f"s3://mlflow/{obj['Key']}")
    assert n > 10  # the artifacts were searched
    assert not leaks, leaks
