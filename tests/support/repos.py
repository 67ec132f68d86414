"""A copy of this repository with tiny params, for tests that run `dvc repro` in it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import REPO, empty_mlflow_store, shared_file


def run_cmd(cmd, cwd, env=None, check=True):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def copy_repo(root: Path) -> None:
    """The code, params and DAG of this repo copied into ``root`` (its own .dvc config, the
    dvc.yaml deps no stage writes), with a small slice of the real WikiText-2 test split
    (1,500 lines) as the local corpus ``data/sources/wiki.raw`` and an empty MLflow store
    ``mlflow.db``: the start of every tiny-repo test."""
    for item in ["pipeline", "stages", "mirrors", "params.yaml", "dvc.yaml", ".gitignore", "pyproject.toml"]:
        src = REPO / item
        if src.is_dir():
            shutil.copytree(src, root / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, root / item)
    _copy_other_deps(root)
    (root / ".dvc").mkdir()
    shutil.copy2(REPO / ".dvc" / "config", root / ".dvc" / "config")
    lines = shared_file("wikitext-2-raw", "wiki.test.raw").read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "data" / "sources").mkdir(parents=True)
    (root / "data" / "sources" / "wiki.raw").write_text("".join(lines[:1500]), encoding="utf-8")
    empty_mlflow_store(root / "mlflow.db")  # the stages' default store, its schema already made


def tiny_params(params: dict) -> dict:
    """``params`` (params.yaml's) shrunk for a tiny-repo run on 2 cores: the WikiText-2 slice
    ``copy_repo`` writes as the local corpus, a 2k vocabulary, a 1-layer model trained 6 steps,
    SST-2 fine-tuning on a few hundred examples with one seed."""
    params["download"]["source"] = "local"
    params["download"]["local"]["path"] = "data/sources/wiki.raw"
    params["clean"]["valid_fraction"] = 0.1
    params["tokenizer"]["vocab_size"] = 2000
    params["examples"].update(dupe_factor=2, docs_per_shard=8, workers=2)
    params["validate"]["nsp_tolerance"] = 0.1
    params["pretrain"] = tiny_pretrain(params["pretrain"])
    params["finetune"] = tiny_finetune(params["finetune"])
    return params


def _copy_other_deps(root: Path) -> None:
    """Copy the dvc.yaml dependencies that no stage writes (e.g. reports/profiles) and the copy lacks."""
    from pipeline.lineage.provenance import dvc_paths, dvc_stages

    stages = dvc_stages(REPO)
    outs = {
        o
        for spec in stages.values()
        for o in dvc_paths((spec.get("outs") or []) + (spec.get("metrics") or []) + (spec.get("plots") or []))
    }
    for spec in stages.values():
        for dep in dvc_paths(spec.get("deps")):
            src, dst = REPO / dep, root / dep
            if dep in outs or dst.exists() or not src.exists() or dep.startswith("data/"):
                continue
            if any(o.startswith(dep + "/") for o in outs):  # a folder stages write into (reports/variants)
                dst.mkdir(parents=True)
                for keep in src.glob(".gitkeep"):
                    shutil.copy2(keep, dst / keep.name)
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)


def tiny_pretrain(p: dict) -> dict:
    """Shrink the pre-training stage so the end-to-end run stays fast on 2 cores."""
    p = dict(p)
    p["model"] = {"preset": "tiny", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    p.update(
        max_steps=6,
        epochs=None,
        time_minutes=None,
        batch_size=8,
        eval_every=3,
        eval_batches=2,
        log_every=1,
        checkpoint_every=3,
        checkpoint_minutes=None,
        num_threads=1,
    )  # two test workers share the cores
    return p


def tiny_finetune(p: dict) -> dict:
    """SST-2 through the hub mirror, a few hundred examples, one seed."""
    p = dict(p)
    p["task"] = dict(p["task"], max_examples={"train": 256, "validation": 128, "test": 128})
    p.update(epochs=1, seeds=[0], batch_size=32, threads=1)
    return p
