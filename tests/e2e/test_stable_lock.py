"""The lock changes only when the science changes (docs/reproducibility.md, "A rebuild is no lock diff").

One small DAG (tests/support/dag.py) is built by clone A following docs/team.md's commands as
written (a directory as the DVC remote); then:

* (e) a teammate's clone runs docs/team.md's teammate commands: ``dvc status`` is clean;
* (a) clone B — another path, its own DVC cache, another time zone, at a commit that differs from
  A's only outside the stages' deps (an MLflow logging function and a doc edited) — builds the DAG:
  its ``dvc.lock`` is byte-identical to A's, the whole file;
* (c) in A, an edit of an MLflow logging function (pipeline/lineage/mlflow_runs.py): ``dvc status``
  lists no stage;
* (b) in a clone that pulled A's outputs, a comment and a renamed local variable in the
  pre-training loop: ``dvc repro`` reruns pretrain only (the same weights: finetune, the variant,
  evaluate, scorecard and plots are skipped);
* (d) every stage of A has a run-cache entry; in a clone of the unbuilt template whose params
  differ, ``dvc exp run --pull -S`` back to A's params restores every stage from the pushed
  run-cache and runs none.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, empty_mlflow_store
from tests.support.dag import dag_env, link_shared, run, template_repo

pytestmark = pytest.mark.slow

GIT_ID = ["-c", "user.name=t", "-c", "user.email=t@t"]
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
STAGES = {
    "download",
    "clean",
    "tokenizer",
    "examples",
    "validate",
    "pretrain",
    "finetune",
    "finetune_variant@frozen",
    "evaluate",
    "scorecard",
    "plots",
}
MAKE_REPRO = "python -m stages.cli check-tracking && dvc repro"  # the Makefile's `repro` after `install`


def _ran(proc: subprocess.CompletedProcess) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", proc.stdout + proc.stderr))


def _shell(cmd: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return run(["bash", "-c", cmd], cwd, env)


def team_commands(block: int) -> list[str]:
    """docs/team.md's ``block``-th bash block (0: the builder's, 1: the teammate's), the lines a test
    can run: no server start/stop, no credentials (a directory remote needs none), comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "docs/team.md").read_text(encoding="utf-8"), re.S)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in blocks[block].splitlines()]
    return [line for line in lines if line and not line.startswith(("make team-", "eval ", "export "))]


def _clone(src: Path, dst: Path, env: dict) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    run(["git", "clone", "-q", str(src), str(dst)], dst.parent, env)
    link_shared(dst)
    return dst


def _env(root: Path, **extra: str) -> dict:
    env = {**dag_env(root), **GIT_ENV, **extra}
    store = root.parent / "mlflow.db"
    if not store.exists():
        empty_mlflow_store(store)
    return env


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """Clone A built by docs/team.md's builder commands, its remote a directory."""
    base = tmp_path_factory.mktemp("stable")
    template = template_repo(base / "template" / "repo")
    remote = base / "remote"
    a = _clone(template, base / "a" / "repo", {})
    env = {**_env(a), **GIT_ENV}
    commands = team_commands(0)
    assert commands[0].startswith("dvc remote add -d team ") and "make repro" in commands, commands
    for cmd in commands:
        cmd = cmd.replace("s3://dvc/bertrace", shlex.quote(str(remote))).replace("make repro", MAKE_REPRO)
        proc = _shell(cmd, a, env)
        if "dvc repro" in cmd:
            assert _ran(proc) == STAGES, proc.stdout
    return {"base": base, "template": template, "remote": remote, "a": a}


def test_e_a_teammate_following_the_docs_has_a_clean_status(team):
    mate = team["base"] / "mate"
    mate.mkdir()
    env = _env(mate / "bertrace")
    for cmd in team_commands(1):
        cmd = cmd.replace("<the repository>", shlex.quote(str(team["a"])))
        if cmd.startswith("git clone"):
            _shell(cmd.split("&&")[0], mate, env)
            link_shared(mate / "bertrace")
            continue
        proc = _shell(cmd, mate / "bertrace", env)
    assert "Data and pipelines are up to date." in proc.stdout, proc.stdout
    assert _shell("git status --porcelain", mate / "bertrace", env).stdout == ""


def test_a_a_rebuild_at_another_path_cache_clock_and_commit_writes_the_same_lock(team):
    b = _clone(team["template"], team["base"] / "elsewhere" / "deeper" / "b" / "repo", {})
    tracking = b / "pipeline/lineage/tracking.py"
    text = tracking.read_text(encoding="utf-8")
    assert '"bertrace.stage": self.stage,' in text
    tracking.write_text(text.replace('"bertrace.stage": self.stage,', '"bertrace.stage": str(self.stage),'))
    (b / "NOTES.md").write_text("a note outside every stage's deps\n")
    run(["git", "add", "-A"], b, {})
    run(["git", *GIT_ID, "commit", "-qm", "only logging and docs"], b, {})
    proc = run(["dvc", "repro"], b, _env(b, TZ="Asia/Kolkata"))
    assert _ran(proc) == STAGES
    lock_a, lock_b = (r / "dvc.lock" for r in (team["a"], b))
    if lock_a.read_bytes() != lock_b.read_bytes():
        sa, sb = (yaml.safe_load(p.read_text())["stages"] for p in (lock_a, lock_b))
        diff = [
            f"{stage} {role} {e['path']}: A {e.get('md5')} != B {f.get('md5')}"
            for stage in sa
            for role in ("deps", "outs")
            for e, f in zip(sa[stage].get(role) or [], sb.get(stage, {}).get(role) or [])
            if e != f
        ]
        pytest.fail("dvc.lock differs between two builds of the same science:\n" + "\n".join(diff or ["(order)"]))


def test_c_editing_an_mlflow_logging_function_leaves_every_stage_up_to_date(team):
    a, env = team["a"], _env(team["a"])
    tracking = a / "pipeline/lineage/mlflow_runs.py"
    text = tracking.read_text(encoding="utf-8")
    try:
        edited = text.replace("def log_stage_on_parent(", "def log_stage_on_parent(  # edited\n", 1)
        assert edited != text
        tracking.write_text(edited)
        proc = run(["dvc", "status"], a, env)
        assert "Data and pipelines are up to date." in proc.stdout, proc.stdout
    finally:
        tracking.write_text(text)


def test_b_a_comment_and_a_renamed_local_in_the_pretraining_loop_rerun_pretraining_only(team):
    d = _clone(team["a"], team["base"] / "d" / "repo", {})
    env = _env(d)
    run(["dvc", "pull", "-q"], d, env)
    lock_before = yaml.safe_load((d / "dvc.lock").read_text())["stages"]
    loop = d / "pipeline/pretrain/metrics.py"  # the module of write_curves
    text = loop.read_text(encoding="utf-8")
    m = re.search(r"^def write_curves\(.*?\n(?=\S|\Z)", text, re.S | re.M)  # to the next top-level line or the end
    assert m and "csv_writer" not in m.group(0) and " w = " in m.group(0), "write_curves changed: pick another local"
    body = re.sub(r"\bw(?=\.| = )", "csv_writer", m.group(0))  # the csv writer `w`, not the file mode "w"
    edited = text.replace(m.group(0), "# Curves are written whole on every checkpoint.\n" + body)
    loop.write_text(edited)
    proc = run(["dvc", "repro"], d, env)
    assert _ran(proc) == {"pretrain"}, proc.stdout
    for stage in STAGES - {"pretrain"}:
        assert f"Stage '{stage}' didn't change, skipping" in proc.stdout, (stage, proc.stdout)
    after = yaml.safe_load((d / "dvc.lock").read_text())["stages"]
    outs = {o["path"]: o["md5"] for o in after["pretrain"]["outs"]}
    outs_before = {o["path"]: o["md5"] for o in lock_before["pretrain"]["outs"]}
    assert outs["data/pretrain"] == outs_before["data/pretrain"]  # the same weights and checkpoint bytes
    assert outs["data/provenance/pretrain.json"] != outs_before["data/provenance/pretrain.json"]  # new code hash
    assert {s: e for s, e in after.items() if s != "pretrain"} == {
        s: e for s, e in lock_before.items() if s != "pretrain"
    }


def test_d_every_stage_is_in_the_run_cache_and_a_pushed_params_set_is_restored_not_run(team):
    a = team["a"]
    runs = [p for p in (a / ".dvc/cache/runs").glob("*/*") if p.is_dir()]
    assert len(runs) == len(STAGES), sorted(p.name for p in runs)
    c = _clone(team["template"], team["base"] / "c" / "repo", {})
    params = yaml.safe_load((c / "params.yaml").read_text())
    min_chars = params["clean"]["min_chars"]
    params["clean"]["min_chars"] = min_chars + 1  # a commit that changed the first stage's recipe
    (c / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["git", *GIT_ID, "commit", "-qam", "other params"], c, {})
    env = _env(c)
    run(["dvc", "remote", "add", "-d", "team", str(team["remote"])], c, env)
    proc = run(["dvc", "exp", "run", "--pull", "-S", f"clean.min_chars={min_chars}"], c, env)
    assert _ran(proc) == set(), proc.stdout
    cached = set(re.findall(r"Stage '([^']+)' is cached - skipping run", proc.stdout + proc.stderr))
    assert cached == STAGES, proc.stdout
    lock_c = yaml.safe_load((c / "dvc.lock").read_text())["stages"]
    lock_a = yaml.safe_load((a / "dvc.lock").read_text())["stages"]
    assert lock_c == lock_a
