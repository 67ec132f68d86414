"""Verification of a lineage (:func:`pipeline.lineage.trace.lineage`): ``verify(lineage, root)``
checks every link and says ``ok``, ``changed`` or ``missing`` (not present) for each:

* ``input`` / ``output``: the sha256 of each recorded file under ``root`` (directories with
  :func:`pipeline.lineage.provenance.hash_path`);
* ``link``: a stage's recorded input equals the upstream stage's recorded output;
* ``params``: the stage's section of ``root/params.yaml`` still hashes to the recorded params;
* ``dvc``: the upstream outputs named by the recorded ``dvc.lock`` md5s are in the DVC cache
  (so ``dvc checkout`` can restore them);
* ``target``: the checkpoint inside an export / MLflow model is the one its metadata names;
* ``shard``: each shard listed by a recorded examples manifest (``data/examples/manifest.json``)
  that is itself unchanged, rehashed against the sha256 the manifest records for it (a shard
  rewritten or truncated after the examples stage is ``changed``).
"""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import yaml

from pipeline.core.formats import MANIFEST
from pipeline.core.io import sha256_file
from pipeline.lineage.provenance import hash_path, params_hash
from pipeline.lineage.trace import quiet_mlflow

OK, CHANGED, MISSING = "ok", "changed", "missing"


def dvc_cache_dir(root: str | os.PathLike) -> Path:
    """The DVC cache of the project at ``root``: ``cache.dir`` of .dvc/config(.local), else .dvc/cache."""
    dvc = Path(root) / ".dvc"
    cache = dvc / "cache"
    for name in ("config", "config.local"):
        parser = configparser.ConfigParser()
        with contextlib.suppress(configparser.Error, OSError):
            parser.read(dvc / name)
            if parser.has_option("cache", "dir"):
                cache = (dvc / parser.get("cache", "dir")).resolve()
    return cache


def _in_dvc_cache(cache: Path, md5: str) -> bool:
    """Whether the object ``md5`` (a file, or a ``.dir`` listing and every file in it) is cached."""

    def obj(h: str) -> Path | None:
        for base in (cache / "files" / "md5", cache):  # DVC 3, then DVC 2 layout
            p = base / h[:2] / h[2:]
            if p.is_file():
                return p
        return None

    p = obj(md5)
    if p is None:
        return False
    if md5.endswith(".dir"):
        try:
            entries = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return False
        return all(isinstance(e, dict) and obj(str(e.get("md5"))) is not None for e in entries)
    return True


def _stage_params(root: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, yaml.YAMLError):
        params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
        return params if isinstance(params, dict) else None
    return None


def _hash_artifact(check: dict[str, Any], root: Path) -> str | None:
    """sha256 of a file named by a check: a local path (relative to ``root``) or an MLflow artifact URI."""
    path = check["path"]
    if "mlflow_uri" not in check:
        p = Path(path) if Path(path).is_absolute() else root / path
        return sha256_file(p) if p.is_file() else None
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory(prefix="bertrace-trace-") as tmp, quiet_mlflow():
        try:
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=path, dst_path=tmp, tracking_uri=check["mlflow_uri"]
            )
        except (MlflowException, OSError):
            return None
        return sha256_file(local)


def verify(lin: dict[str, Any], root: str | os.PathLike = Path(".")) -> list[dict[str, Any]]:
    """Check every link of a lineage against what is present under ``root``.

    One entry per check: ``{stage, role, path, recorded, actual, status}``; ``role`` is
    ``input`` / ``output`` (file sha256), ``link`` (input vs the upstream stage's recorded
    output; ``upstream`` names it), ``params`` (params.yaml section hash; ``detail`` lists
    changed keys), ``dvc`` (dvc.lock md5 in the DVC cache), ``target`` or ``shard`` (a shard
    against the sha256 in its examples manifest, named by ``manifest``; only for a manifest that
    matches its record). ``status`` is ``ok``, ``changed`` or ``missing`` (``actual`` is ``None``:
    not present). Each file is hashed once.
    """
    root = Path(root)
    cache: dict[str, str | None] = {}
    results: list[dict[str, Any]] = []

    def add(stage, role, path, recorded, actual, **more):
        status = MISSING if actual is None else OK if actual == recorded else CHANGED
        results.append(
            {
                "stage": stage,
                "role": role,
                "path": path,
                "recorded": recorded,
                "actual": actual,
                "status": status,
                **more,
            }
        )

    for check in lin.get("checks") or []:
        add(
            lin["chain"][0]["stage"] if lin.get("chain") else "-",
            "target",
            check["path"],
            check["recorded"],
            _hash_artifact(check, root),
            what=check.get("what"),
        )

    chain = lin.get("chain", [])
    params_file = _stage_params(root)
    dvc_cache = dvc_cache_dir(root)
    for i, node in enumerate(chain):
        for role, paths in (("input", node.get("inputs") or {}), ("output", node.get("outputs") or {})):
            for path, recorded in paths.items():
                if path not in cache:
                    p = Path(path) if Path(path).is_absolute() else root / path
                    try:
                        cache[path] = hash_path(p) if p.exists() else None
                    except (FileNotFoundError, PermissionError):
                        cache[path] = None
                add(node["stage"], role, path, recorded, cache[path])
        for path, recorded in (node.get("inputs") or {}).items():  # cross-links to upstream outputs
            for up in chain[i + 1 :]:
                if path in (up.get("outputs") or {}):
                    add(node["stage"], "link", path, recorded, up["outputs"][path], upstream=up["stage"])
                    break
        section = (params_file or {}).get(node["stage"])
        recorded_params = node.get("params")
        # The record holds the keys that shape the output (a data stage's worker keys left out).
        if isinstance(section, dict) and isinstance(recorded_params, dict) and set(recorded_params) <= set(section):
            current = {k: section[k] for k in recorded_params}
            detail = [
                f"{k}: {recorded_params[k]!r} -> {current[k]!r}"
                for k in sorted(current)
                if params_hash(current[k]) != params_hash(recorded_params[k])
            ]
            add(
                node["stage"],
                "params",
                f"params.yaml:{node['stage']}",
                node.get("params_hash"),
                params_hash(current),
                detail=detail,
            )
        for path, md5 in (node.get("dvc_outs") or {}).items():
            add(node["stage"], "dvc", path, md5, md5 if _in_dvc_cache(dvc_cache, md5) else None)
    for stage, manifest, shards in _recorded_shards(chain, root, cache):
        for path, recorded, actual in _hash_shards(root, shards):
            add(stage, "shard", path, recorded, actual, manifest=manifest)
    return results


def _recorded_shards(
    chain: list[dict[str, Any]], root: Path, hashes: dict[str, str | None]
) -> Iterator[tuple[str, str, list[tuple[str, str]]]]:
    """``(stage, manifest path, [(shard path, recorded sha256), ...])`` for each examples manifest
    named by the chain whose bytes here are the recorded ones: its per-shard sha256s are then
    part of the record too (a manifest that changed is reported as such, its shards are not read).
    The stage is the one that wrote the manifest (examples), else the first that read it."""
    named: dict[str, tuple[str, set[str]]] = {}
    for node in chain:
        for role in ("outputs", "inputs"):
            for path, recorded in (node.get(role) or {}).items():
                if Path(path).name != MANIFEST:
                    continue
                stage, seen = named.get(path, (node["stage"], set()))
                if role == "outputs":
                    stage = node["stage"]
                named[path] = (stage, seen | {recorded})
    for path, (stage, recorded) in named.items():
        if hashes.get(path) not in recorded:
            continue
        p = Path(path) if Path(path).is_absolute() else root / path
        try:
            manifest = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        splits = manifest.get("splits") if isinstance(manifest, dict) else None
        if not isinstance(splits, dict):
            continue  # not an examples manifest (no splits → shards)
        shards = [
            ((Path(path).parent / e["path"]).as_posix(), e["sha256"])
            for info in splits.values()
            if isinstance(info, dict) and isinstance(info.get("shards"), list)
            for e in info["shards"]
            if isinstance(e, dict) and isinstance(e.get("path"), str) and isinstance(e.get("sha256"), str)
        ]
        if shards:
            yield stage, path, shards


def _hash_shards(root: Path, shards: list[tuple[str, str]]) -> list[tuple[str, str, str | None]]:
    """``(path, recorded, actual)`` per shard, hashed in threads; a progress bar after 2 s on a terminal."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    files = [Path(p) if Path(p).is_absolute() else root / p for p, _ in shards]
    total = sum(f.stat().st_size for f in files if f.is_file())

    def digest(f: Path) -> str | None:
        if not f.is_file():
            return None
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
                bar.update(len(block))
        return h.hexdigest()

    with (
        tqdm(total=total, unit="B", unit_scale=True, desc="verify shards", delay=2, leave=False, disable=None) as bar,
        ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool,
    ):
        actual = list(pool.map(digest, files))
    return [(p, recorded, now) for (p, recorded), now in zip(shards, actual)]


def summary(verification: list[dict[str, Any]]) -> dict[str, int]:
    counts = {OK: 0, CHANGED: 0, MISSING: 0}
    for v in verification:
        counts[v["status"]] = counts.get(v["status"], 0) + 1
    return counts
