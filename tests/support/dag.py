"""A small DAG in a fresh git repo, for end-to-end tests that run real `dvc repro`s.

``template_repo(root)`` snapshots the working tree's code, dvc.yaml and params (shrunk by
``tiny_params``: a 1500-line WikiText slice, 2k vocab, a 1-layer model, 8 updates) into a git repo
committed with a fixed author and date; copies or clones of it run with ``dag_env(root)``. A copy
needs ``<copy>/../shared`` to point at the shared data (``link_shared``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import REPO, SHARED_DATA, shared_file


def link_shared(repo: Path) -> None:
    """``<repo>/../shared`` -> the shared data's parent, as on the build machines (mirrors/shared-data.yaml)."""
    link = repo.parent / "shared"
    if not link.exists():
        link.symlink_to(SHARED_DATA.parent, target_is_directory=True)


def run(cmd: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"{cmd} in {cwd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def other_deps() -> list[str]:
    """dvc.yaml dependencies that no stage writes and that are not data (e.g. reports/profiles)."""
    from pipeline.lineage.provenance import dvc_paths, dvc_stages

    stages = dvc_stages(REPO)  # foreach stages expanded
    outs = {
        o
        for spec in stages.values()
        for o in dvc_paths((spec.get("outs") or []) + (spec.get("metrics") or []) + (spec.get("plots") or []))
    }
    deps = {
        dep
        for spec in stages.values()
        for dep in dvc_paths(spec.get("deps"))
        if dep not in outs and not dep.startswith("data/") and (REPO / dep).exists()
    }
    # a folder stages write into (reports/variants): its .gitkeep only
    return sorted(f"{d}/.gitkeep" if any(o.startswith(d + "/") for o in outs) else d for d in deps)


def tiny_params(params: dict) -> dict:
    """The small config: a 1500-line WikiText slice, 2k vocab, a 1-layer model trained 8 steps."""
    params["download"]["source"] = "local"
    params["download"]["local"]["path"] = "data/sources/wiki.raw"
    params["tokenizer"]["vocab_size"] = 2000
    params["examples"].update(dupe_factor=2, docs_per_shard=8)
    params["validate"]["nsp_tolerance"] = 0.1
    p = params["pretrain"]
    p["model"] = {"preset": "tiny", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    p.update(
        num_threads=1,
        max_steps=8,
        epochs=None,
        time_minutes=None,
        snapshot_minutes=[],
        batch_size=8,
        eval_every=4,
        eval_batches=2,
        log_every=1,
        checkpoint_every=4,
        checkpoint_minutes=None,
    )
    if "snapshot_steps" in p:
        p["snapshot_steps"] = []
    f = params["finetune"]
    f["task"] = dict(f["task"], max_examples={"train": 256, "validation": 128, "test": 128})
    f.update(epochs=1, seeds=[0], batch_size=32, threads=1)  # one thread: two test workers share the cores
    params["finetune_variants"] = {"frozen": params["finetune_variants"]["frozen"]}  # one variant: its bytes too
    return params


def template_repo(root: Path) -> Path:
    """One snapshot of the working tree (so both copies run the same code even while it is being
    edited), committed with a fixed author and date: both copies then report the same commit."""
    for item in [
        "pipeline",
        "stages",
        "mirrors",
        "params.yaml",
        "dvc.yaml",
        ".gitignore",
        "pyproject.toml",
        "scripts/ci-data-checks.sh",
        *other_deps(),
    ]:
        src, dst = REPO / item, root / item
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dst)
    (root / ".dvc").mkdir()
    shutil.copy2(REPO / ".dvc" / "config", root / ".dvc" / "config")
    shared_file("sst2", "train.tsv")
    lines = shared_file("wikitext-2-raw", "wiki.test.raw").read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "data" / "sources").mkdir(parents=True)
    (root / "data" / "sources" / "wiki.raw").write_text("".join(lines[:1500]), encoding="utf-8")
    params = tiny_params(yaml.safe_load((root / "params.yaml").read_text()))
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    git_env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
        "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
    }
    run(["git", "init", "-q"], root, git_env)
    run(["git", "add", "-A"], root, git_env)
    run(["git", "commit", "-qm", "init"], root, git_env)
    return root


def dag_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(root)
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{root.parent}/mlflow.db"  # MLflow on, one store per copy
    env["BERTRACE_HUB_MIRROR"] = "mirrors/shared-data.yaml"  # SST-2 from <repo>/../shared/data, as the Makefile does
    env["TQDM_DISABLE"] = "1"
    for key in ("BERTRACE_PIPELINE_RUN_ID", "BERTRACE_NO_MLFLOW", "BERTRACE_ENGINE", "BERTRACE_DASK_SCHEDULER"):
        env.pop(key, None)
    return env
