"""The line a stage prints when the tracking server is down under `dvc repro` (stages.common's
_restore_hint): DVC removed the stage's outputs before it started, and following the line puts back
the outputs dvc.lock names, so `dvc status` is clean again, after a committed or an uncommitted run,
with the outputs in the local DVC cache, only on the DVC remote, or nowhere.

A real DVC repository in tmp with one cheap stage that opens a real StageRun (stages.common) and
writes two DVC-cached outputs and, where asked, a `cache: false` metrics file kept in git."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

STAGE = """\
import pathlib
from stages.common import StageRun, load_params, run_stage


def main():
    params = load_params("s")
    with StageRun("s", params) as run:
        pathlib.Path("out.txt").write_text(f"out {params['v']}\\n")
        pathlib.Path("outdir").mkdir(exist_ok=True)
        pathlib.Path("outdir/a").write_text(f"a {params['v']}\\n")
        run.write_metrics({"v": params["v"]}, "m.json")


if __name__ == "__main__":
    run_stage(main)
"""

TAIL = " (`make repro` checks the store before DVC touches anything)"


def _env(**extra) -> dict:
    env = dict(os.environ)  # MLFLOW_TRACKING_URI: the test's SQLite store (tests/conftest.py)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(REPO)
    for key in ("BERTRACE_NO_MLFLOW", "BERTRACE_PIPELINE_RUN_ID", "DVC_STAGE", "DVC_ROOT"):
        env.pop(key, None)
    env.update(extra)
    return env


def _run(cmd, cwd: Path, check: bool = True, **extra) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=_env(**extra), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _repo(root: Path, *, uncached: bool) -> Path:
    """A git + DVC repository with stage ``s``, built once at v=1 and committed."""
    root.mkdir()
    metrics = "    metrics:\n    - m.json:\n        cache: false\n" if uncached else "    - m.json\n"
    (root / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: python stage.py\n    deps: [stage.py]\n    params: [s.v]\n"
        "    outs:\n    - out.txt\n    - outdir\n" + metrics
    )
    (root / "stage.py").write_text(STAGE)
    (root / "params.yaml").write_text("s:\n  v: 1\n")
    (root / ".gitignore").write_text("runs/\n")
    _run(["git", "init", "-q"], root)
    _run(["dvc", "init", "-q"], root)
    _run(["dvc", "config", "core.analytics", "false"], root)
    _run(["dvc", "repro"], root)
    _commit(root)
    return root


def _commit(root: Path) -> None:
    _run(["git", "add", "-A"], root)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "run"], root)


def _outputs(root: Path) -> dict[str, bytes]:
    return {p: (root / p).read_bytes() for p in ("out.txt", "outdir/a", "m.json") if (root / p).exists()}


def _dead_uri() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens: connection refused


def _fail(root: Path) -> str:
    """`dvc repro -f -s s` with the tracking server down: the stage's one error line."""
    dead = _dead_uri()
    proc = _run(["dvc", "repro", "-f", "-s", "s"], root, check=False, MLFLOW_TRACKING_URI=dead)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: MLFLOW_TRACKING_URI={dead}: "), text
    assert "Traceback" not in text
    assert not (root / "out.txt").exists()  # DVC removed the outputs before the stage ran
    return errors[0]


def _follow(line: str, root: Path) -> None:
    """Run the commands the line names (the tracking store answers again for `dvc repro`)."""
    for cmd in re.findall(r"`([^`]+)`", line):
        if cmd.startswith(("dvc checkout", "dvc pull", "dvc repro", "git checkout --")):
            _run(cmd.split(), root)


def _clean(root: Path) -> None:
    status = _run(["dvc", "status"], root).stdout
    assert "Data and pipelines are up to date" in status, status


def test_uncommitted_run_all_cached_dvc_checkout_restores_it(tmp_path):
    root = _repo(tmp_path / "r", uncached=False)
    (root / "params.yaml").write_text("s:\n  v: 2\n")
    _run(["dvc", "repro"], root)  # not committed: dvc.lock names v=2's outputs, HEAD v=1's
    before = _outputs(root)
    line = _fail(root)
    assert line.endswith(f"; DVC removed s's outputs before it ran: `dvc checkout s` puts them back{TAIL}"), line
    _follow(line, root)
    assert _outputs(root) == before
    _clean(root)


def test_uncommitted_run_uncached_output_at_head_differs_so_the_stage_reruns(tmp_path):
    root = _repo(tmp_path / "r", uncached=True)
    (root / "params.yaml").write_text("s:\n  v: 2\n")
    _run(["dvc", "repro"], root)
    before = _outputs(root)
    line = _fail(root)
    assert line.endswith(
        "; DVC removed s's outputs before it ran and neither the DVC cache, a DVC remote nor git's HEAD "
        f"holds m.json as dvc.lock names it: rerun `dvc repro s` once the tracking server answers{TAIL}"
    ), line
    _follow(line, root)
    assert _outputs(root) == before
    _clean(root)


def test_committed_run_uncached_output_comes_back_from_git(tmp_path):
    root = _repo(tmp_path / "r", uncached=True)
    before = _outputs(root)
    line = _fail(root)
    assert line.endswith(
        "; DVC removed s's outputs before it ran: `dvc checkout s` puts them back "
        f"(`git checkout -- m.json` the uncached ones){TAIL}"
    ), line
    _follow(line, root)
    assert _outputs(root) == before
    _clean(root)


def test_outputs_missing_from_the_cache_are_pulled_else_the_stage_reruns(tmp_path):
    root = _repo(tmp_path / "r", uncached=False)
    (root / "params.yaml").write_text("s:\n  v: 2\n")
    _run(["dvc", "remote", "add", "-d", "team", str(tmp_path / "remote")], root)
    _run(["dvc", "repro"], root)
    _run(["dvc", "push"], root)
    before = _outputs(root)
    shutil.rmtree(root / ".dvc" / "cache")  # a clone that has not pulled, a `dvc gc`: only the remote has them
    line = _fail(root)
    assert line.endswith(f"; DVC removed s's outputs before it ran: `dvc pull s` puts them back{TAIL}"), line
    _follow(line, root)
    assert _outputs(root) == before
    _clean(root)

    _run(["dvc", "remote", "remove", "team"], root)
    shutil.rmtree(root / ".dvc" / "cache")
    line = _fail(root)
    assert line.endswith(
        "; DVC removed s's outputs before it ran and neither the DVC cache, a DVC remote nor git's HEAD "
        f"holds out.txt outdir m.json as dvc.lock names them: rerun `dvc repro s` once the tracking server answers{TAIL}"
    ), line
    _follow(line, root)
    assert _outputs(root) == before
    _clean(root)
