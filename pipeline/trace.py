"""Lineage of a model: the chain of stages, code versions and data hashes behind a checkpoint.

``lineage(target)`` reads the provenance embedded in a checkpoint (fine-tuned ``model.pt`` or a
pre-training ``best.pt`` / ``last.pt``) or a provenance record (``data/provenance/<stage>.json``)
and flattens the nested records into a chain, newest first::

    finetune → pretrain → examples → tokenizer → clean → download

(whichever are present). ``verify(lineage, root)`` recomputes the sha256 of every recorded input
and output that exists under ``root`` (directories with :func:`pipeline.provenance.hash_path`)
and says, per path, ``ok`` (same bytes), ``changed`` (different bytes) or ``missing`` (not
present under ``root``; e.g. a DVC output not checked out, or data on another machine).
``format_tree`` renders both as text.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeline.errors import BertraceError
from pipeline.evaluate import STAGE_ORDER, _records
from pipeline.provenance import hash_path

OK, CHANGED, MISSING = "ok", "changed", "missing"


# --------------------------------------------------------------------------------------------
# Reading the target


def _load_target(target: Path) -> tuple[str, dict[str, Any]]:
    """``(kind, provenance record)`` of a checkpoint or provenance JSON file."""
    if not target.exists():
        raise BertraceError(f"{target}: not found; give a checkpoint (data/finetune/model.pt, "
                            "data/pretrain/best.pt) or a provenance record (data/provenance/<stage>.json)")
    if target.is_dir():
        raise BertraceError(f"{target}: is a directory; give a checkpoint (.pt) or a provenance record (.json)")
    if target.suffix == ".json":
        try:
            record = json.loads(target.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BertraceError(f"{target}: not valid JSON ({e}); rerun the stage that writes it "
                                "or restore it with `dvc checkout`") from None
        if not isinstance(record, dict) or not isinstance(record.get("stage"), str):
            raise BertraceError(f"{target}: not a bertrace provenance record (no 'stage' field)")
        return "provenance record", record
    from pipeline.inference import read_checkpoint  # imports torch: only for checkpoints

    ckpt = read_checkpoint(target)
    record = ckpt.get("provenance")
    if not isinstance(record, dict) or not record:
        raise BertraceError(f"{target}: checkpoint has no provenance record; it was not written by a "
                            "bertrace stage (rerun `dvc repro` to get a traceable one)")
    kind = "fine-tuned checkpoint" if "num_labels" in ckpt else "pre-training checkpoint"
    return kind, record


def _node(name: str, rec: dict[str, Any]) -> dict[str, Any]:
    git = rec.get("git") if isinstance(rec.get("git"), dict) else {}
    return {
        "stage": name,
        "git_commit": git.get("commit"),
        "git_dirty": git.get("dirty"),
        "dirty_paths": list(git.get("dirty_paths") or []),
        "params_hash": rec.get("params_hash"),
        "started": rec.get("started"),
        "finished": rec.get("finished"),
        "pipeline_run_id": rec.get("pipeline_run_id"),
        "mlflow_run_id": rec.get("mlflow_run_id"),
        "inputs": {str(k): v for k, v in (rec.get("inputs") or {}).items() if isinstance(v, str)},
        "outputs": {str(k): v for k, v in (rec.get("outputs") or {}).items() if isinstance(v, str)},
    }


def lineage(target: str | os.PathLike) -> dict[str, Any]:
    """The stages behind ``target`` (a checkpoint or a provenance JSON), newest first.

    Returns ``{target, kind, target_sha256, chain: [node, ...], conflicts: [...]}``; each node is
    ``{stage, git_commit, git_dirty, dirty_paths, params_hash, started, finished, pipeline_run_id,
    mlflow_run_id, inputs {path: sha256}, outputs {path: sha256}}``. A stage embedded more than
    once (clean via tokenizer and via examples) is listed once, from its most downstream
    occurrence; if the copies disagree (different params or hashes) it is named in ``conflicts``.
    Plain JSON: ``json.loads(json.dumps(x)) == x``.
    """
    target = Path(target)
    kind, record = _load_target(target)
    nodes: dict[str, dict[str, Any]] = {}
    conflicts: list[str] = []
    for name, rec in _records(record, record.get("stage")):
        node = _node(name, rec)
        if name not in nodes:
            nodes[name] = node
        elif (nodes[name]["params_hash"], nodes[name]["inputs"], nodes[name]["outputs"]) != (
                node["params_hash"], node["inputs"], node["outputs"]) and name not in conflicts:
            conflicts.append(name)
    order = {s: i for i, s in enumerate(STAGE_ORDER)}
    chain = sorted(nodes.values(), key=lambda n: order.get(n["stage"], len(order)))
    return {"target": target.as_posix(), "kind": kind, "target_sha256": hash_path(target),
            "chain": chain, "conflicts": conflicts}


# --------------------------------------------------------------------------------------------
# Verification


def verify(lin: dict[str, Any], root: str | os.PathLike = Path(".")) -> list[dict[str, Any]]:
    """Recompute the hash of every recorded input and output path under ``root``.

    One entry per (stage, path, role): ``{stage, role (input|output), path, recorded, actual,
    status}`` with ``status`` ``ok`` / ``changed`` / ``missing`` (``actual`` is ``None`` when
    missing). Each path is hashed once.
    """
    root = Path(root)
    cache: dict[str, str | None] = {}
    results = []
    for node in lin.get("chain", []):
        for role, paths in (("input", node.get("inputs") or {}), ("output", node.get("outputs") or {})):
            for path, recorded in paths.items():
                if path not in cache:
                    p = Path(path) if Path(path).is_absolute() else root / path
                    try:
                        cache[path] = hash_path(p) if p.exists() else None
                    except (FileNotFoundError, PermissionError):
                        cache[path] = None
                actual = cache[path]
                status = MISSING if actual is None else OK if actual == recorded else CHANGED
                results.append({"stage": node["stage"], "role": role, "path": path,
                                "recorded": recorded, "actual": actual, "status": status})
    return results


def summary(verification: list[dict[str, Any]]) -> dict[str, int]:
    counts = {OK: 0, CHANGED: 0, MISSING: 0}
    for v in verification:
        counts[v["status"]] = counts.get(v["status"], 0) + 1
    return counts


# --------------------------------------------------------------------------------------------
# Text rendering


def _short(h: str | None, n: int = 12) -> str:
    return h[:n] if h else "-"


def format_tree(lin: dict[str, Any], verification: list[dict[str, Any]] | None = None) -> str:
    """A readable tree, newest stage first, with short hashes and (when verified) status marks."""
    status = {(v["stage"], v["role"], v["path"]): v for v in (verification or [])}
    lines = [f"{lin['target']}  ({lin['kind']}, sha256 {_short(lin.get('target_sha256'))})"]
    chain = lin.get("chain", [])
    for depth, node in enumerate(chain):
        pad = "   " * depth
        commit = _short(node.get("git_commit")) if node.get("git_commit") else "no git"
        dirty = " (dirty)" if node.get("git_dirty") else ""
        lines.append(f"{pad}└─ {node['stage']}  commit {commit}{dirty}  params {_short(node.get('params_hash'))}"
                     f"  finished {node.get('finished') or '-'}")
        body = pad + ("     " if depth == len(chain) - 1 else "   │ ")
        rows = [("in ", "input", p, h) for p, h in sorted(node.get("inputs", {}).items())]
        rows += [("out", "output", p, h) for p, h in sorted(node.get("outputs", {}).items())]
        width = max((len(p) for _, _, p, _ in rows), default=0)
        for label, role, path, digest in rows:
            line = f"{body} {label} {path:<{width}}  {_short(digest)}"
            v = status.get((node["stage"], role, path))
            if v is not None:
                line += f"  {v['status']}"
                if v["status"] == CHANGED:
                    line += f" (now {_short(v['actual'])})"
            lines.append(line.rstrip())
    if lin.get("conflicts"):
        lines.append("conflicting copies of upstream records: " + ", ".join(lin["conflicts"]))
    if verification is not None:
        c = summary(verification)
        lines.append(f"verify: {c[OK]} ok, {c[CHANGED]} changed, {c[MISSING]} missing")
    return "\n".join(lines)
