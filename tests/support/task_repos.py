"""A tiny repository for another task type (token classification, regression), built with `dvc repro`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml


def tiny_repo(root: Path, finetune_task: dict, files: dict[str, bytes]) -> tuple[Path, dict]:
    """A copy of the repo with tiny pretrain params (as tests/e2e/test_dvc_pipeline.py), the task data
    ``files`` written under data/sources and ``finetune.task`` set; committed to git."""
    from tests.support.repos import copy_repo, run_cmd, tiny_pretrain

    copy_repo(root)
    sources = root / "data" / "sources"
    for name, data in files.items():
        (sources / name).write_bytes(data)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["download"]["source"] = "local"
    params["download"]["local"]["path"] = "data/sources/wiki.raw"
    params["clean"]["valid_fraction"] = 0.1
    params["tokenizer"]["vocab_size"] = 1000
    params["examples"].update(dupe_factor=1, docs_per_shard=8, workers=1)
    params["validate"]["nsp_tolerance"] = 0.2
    params["pretrain"] = tiny_pretrain(params["pretrain"])
    params["finetune"]["task"] = {**params["finetune"]["task"], **finetune_task}
    params["finetune"].update(epochs=2, seeds=[0], batch_size=16, max_len=64, lr=1e-3, threads=1)
    params["evaluate"]["log_model"] = False
    params["finetune_variants"] = {}  # the frozen / scratch stages: tests/e2e/test_dvc_pipeline.py
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(root)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("BERTRACE_HUB_MIRROR", None)
    env["TQDM_DISABLE"] = "1"
    run_cmd(["git", "init", "-q"], root)
    run_cmd(["git", "add", "-A"], root)
    run_cmd(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"], root)
    return root, env


def dvc_repro(root: Path, env: dict, target: str = "evaluate") -> str:
    proc = subprocess.run(["dvc", "repro", target], cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"dvc repro {target} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def declared_evaluate_outputs(root: Path) -> list[str]:
    from pipeline.lineage.provenance import dvc_paths

    spec = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["evaluate"]
    return dvc_paths((spec.get("outs") or []) + (spec.get("metrics") or []) + (spec.get("plots") or []))
