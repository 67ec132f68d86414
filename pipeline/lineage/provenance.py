"""Provenance records: what code, params and input bytes produced an output.

Every stage writes one record (``data/provenance/<stage>.json``, a DVC output). A record names
the stage's params and their hash, the sha256 of every code file the stage imports (its
``dvc.yaml`` code deps) and of every input it read and every output it wrote, library versions,
and — embedded — the records of the upstream stages whose outputs it consumed. A checkpoint
therefore carries the whole chain back to the raw corpus.

A record also names the ``dvc.lock`` entries (md5 of every output) of the upstream stages as
they were when the stage ran (``dvc_lock``): the keys to the DVC cache, so ``dvc checkout``
can give back the exact inputs. :func:`chain_ids` picks the hashes that identify a run's
place in the pipeline (tokenizer, examples, checkpoints …); stages tag MLflow runs with them.

A record holds nothing about *when*, *where* or *by which run* it was made, so two builds of the
same code, params and data write the same record bytes and leave ``dvc.lock`` unchanged; that part
is the stage's run log (:mod:`pipeline.lineage.runlog`). A record's ``code`` (the sha256 of each code
dep) is the one part that changes with an edit that changes no output, so what later stages read
leaves it out: a checkpoint embeds :func:`without_code` of its chain, and :func:`record_digest` —
the key run logs and MLflow runs use — ignores it. Editing a comment in the pre-training loop then
rewrites ``data/provenance/pretrain.json`` (no stage depends on it) but not ``best.pt``, and the
rebuild stops there (docs/provenance.md, "Records and run logs").

This module decides the bytes of every record, so it is a code dep of every stage that writes
one; :data:`RECORD_VERSION` names its format. The modules in :data:`OUTPUT_NEUTRAL` only report —
MLflow runs and tags, run logs, the restore clause of an error — and no DVC output is computed from them: a stage's code deps in
dvc.yaml are its import closure *without* them (``tests/unit/test_dvc_deps.py``), so editing how a
tag is written reruns nothing. Such a module writes no DVC output and returns nothing a stage writes
into one (tested there too).
"""

from __future__ import annotations

import os
import platform
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import yaml

from pipeline.core.io import canonical_json, read_json, sha256_bytes, sha256_file, sha256_json

OUTPUT_NEUTRAL = (
    "pipeline.lineage.mlflow_names",
    "pipeline.lineage.mlflow_runs",
    "pipeline.lineage.mlflow_store",
    "pipeline.lineage.restore",
    "pipeline.lineage.runlog",
    "pipeline.lineage.tracking",
)  # not code deps (module docstring)
PROVENANCE_DIR = Path("data/provenance")  # data/provenance/<stage>.json: each stage's record (a DVC output)
RECORD_VERSION = 3  # the format of records (docs/formats.md "Provenance record"); raise it when their fields change

LIBRARIES = (
    "torch",
    "tokenizers",
    "datasets",
    "pyarrow",
    "pandas",
    "numpy",
    "mlflow",
    "great-expectations",
    "dvc",
    "transformers",
)


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def hash_path(path: str | os.PathLike) -> str:
    """sha256 of a file, or of a directory's sorted ``relpath sha256`` listing (like DVC's .dir)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    if path.is_dir():
        lines = [
            f"{p.relative_to(path).as_posix()} {sha256_file(p)}"
            for p in sorted(path.rglob("*"))
            if p.is_file() and not p.name.startswith(".")
        ]
        return sha256_bytes("\n".join(lines).encode())
    raise FileNotFoundError(path)


def params_hash(params: Any) -> str:
    return sha256_json(params)


def build_record(
    stage: str,
    params: Any,
    *,
    inputs: dict[str, str],
    outputs: dict[str, str],
    upstream: dict[str, Any] | None = None,
    dvc_lock: dict[str, Any] | None = None,
    code: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble one provenance record (a plain, JSON-able dict): a function of the stage's code,
    params and input bytes only (no times, run ids, hosts or absolute paths)."""
    record = {
        "record_version": RECORD_VERSION,
        "stage": stage,
        "params": params,
        "params_hash": params_hash(params),
        "code": dict(sorted((code or {}).items())),
        "inputs": dict(sorted(inputs.items())),
        "outputs": dict(sorted(outputs.items())),
        "upstream": upstream or {},
        "dvc_lock": dvc_lock,
        "libraries": library_versions(),
        "platform": {"python": sys.version.split()[0], "machine": platform.machine(), "system": platform.system()},
    }
    if extra:
        record.update(extra)
    return record


def read_record(stage: str, root: str | os.PathLike = ".") -> dict[str, Any] | None:
    """The record ``stage`` left in ``root``/data/provenance/, or None when there is none."""
    path = Path(root) / PROVENANCE_DIR / f"{stage}.json"
    return read_json(path) if path.exists() else None


def code_hashes(stage: str, root: str | os.PathLike = ".") -> dict[str, str]:
    """``{path: sha256}`` of the Python files ``stage`` lists as deps in ``root``/dvc.yaml (its
    import closure, tests/unit/test_dvc_deps.py); {} for a stage dvc.yaml does not know."""
    root = Path(root)
    spec = dvc_stages(root).get(stage)
    if not isinstance(spec, dict):
        return {}
    return {p: sha256_file(root / p) for p in dvc_paths(spec.get("deps")) if p.endswith(".py") and (root / p).is_file()}


def without_code(record: Any) -> Any:
    """``record`` and every record embedded in it without their code identity: ``code`` (the code
    deps' sha256) and the ``.py`` deps of ``dvc_lock`` entries. What a checkpoint embeds: it then
    changes only when the data, params or libraries behind it do (a copy)."""
    if isinstance(record, list):
        return [without_code(r) for r in record]
    if not isinstance(record, dict):
        return record
    out = {}
    for key, value in record.items():
        if key == "code" and isinstance(value, dict):
            continue
        if key == "dvc_lock" and isinstance(value, dict):
            value = {stage: _lock_without_code(entry) for stage, entry in value.items()}
        elif key in ("upstream", "pretrain") or isinstance(value, (dict, list)) and key != "params":
            value = without_code(value)
        out[key] = value
    return out


def _lock_without_code(entry: Any) -> Any:
    if not isinstance(entry, dict) or not isinstance(entry.get("deps"), dict):
        return entry
    return {**entry, "deps": {p: md5 for p, md5 in entry["deps"].items() if not str(p).endswith(".py")}}


def record_digest(record: dict[str, Any]) -> str:
    """sha256 of a record's canonical JSON, its code identity left out (:func:`without_code`): the
    same for ``data/provenance/<stage>.json`` and the copy a checkpoint embeds."""
    return sha256_bytes(canonical_json(without_code(record)).encode())


# --------------------------------------------------------------------------------------------
# Walking a record: the chain of stages and its ids


# The DAG's stages, newest first (the order lineages are printed in).
STAGE_ORDER = ("evaluate", "finetune", "pretrain", "validate", "examples", "tokenizer", "clean", "download")


def iter_records(record: dict[str, Any], name: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(stage, record)`` for a record and every record embedded in it, depth first.

    Embedded records live under ``"upstream"`` (``{stage: record}`` or a list of records) and
    ``"pretrain"`` (a fine-tuned checkpoint's pre-training provenance).
    """
    if not isinstance(record, dict):
        return
    yield (record.get("stage") or name or "?"), record
    if isinstance(record.get("pretrain"), dict):
        yield from iter_records(record["pretrain"], "pretrain")
    upstream = record.get("upstream")
    if isinstance(upstream, dict):
        for stage, sub in upstream.items():
            yield from iter_records(sub, stage)
    elif isinstance(upstream, list):
        for sub in upstream:
            yield from iter_records(sub, None)


# chain id -> where to find it, in order of preference: (stage, "inputs"|"outputs", file name).
# A downstream stage's input comes first: it names the bytes that were actually consumed.
CHAIN_IDS: dict[str, list[tuple[str, str, str]]] = {
    "raw_sha256": [("clean", "inputs", "raw"), ("download", "outputs", "raw")],
    "clean_train_sha256": [
        ("tokenizer", "inputs", "train.txt"),
        ("examples", "inputs", "train.txt"),
        ("validate", "inputs", "train.txt"),
        ("clean", "outputs", "train.txt"),
    ],
    "tokenizer_sha256": [
        ("examples", "inputs", "tokenizer.json"),
        ("finetune", "inputs", "tokenizer.json"),
        ("tokenizer", "outputs", "tokenizer.json"),
    ],
    "examples_sha256": [
        ("pretrain", "inputs", "manifest.json"),
        ("validate", "inputs", "manifest.json"),
        ("examples", "outputs", "manifest.json"),
    ],
    "pretrain_checkpoint_sha256": [
        ("finetune", "inputs", ".pt"),
        ("pretrain", "outputs", "best.pt"),
        ("pretrain", "outputs", "last.pt"),
    ],
    "finetune_checkpoint_sha256": [("evaluate", "inputs", "model.pt"), ("finetune", "outputs", "model.pt")],
}
CHAIN_TAG_PREFIX = "bertrace.chain."


def chain_ids(record: dict[str, Any]) -> dict[str, str]:
    """The hashes that place a record in the pipeline: ``{"tokenizer_sha256": ..., ...}``.

    Read from the record and its embedded upstream records, so every run downstream of a
    tokenizer carries that tokenizer's hash (an MLflow filter on it finds them all).
    """
    records = list(iter_records(record))
    ids: dict[str, str] = {}
    for key, sources in CHAIN_IDS.items():
        for stage, role, name in sources:
            found = [
                digest
                for s, rec in records
                if s == stage
                for path, digest in sorted((rec.get(role) or {}).items())
                if isinstance(digest, str)
                and (Path(path).name == name or (name.startswith(".") and path.endswith(name)))
            ]
            if found:
                ids[key] = found[0]
                break
    return ids


# --------------------------------------------------------------------------------------------
# DVC: the upstream stages' dvc.lock entries


def dvc_paths(entries: list[Any] | None, params: dict[str, Any] | None = None) -> list[str]:
    """The paths of dvc.yaml entries; ``${section.key}`` filled from ``params`` (params.yaml), as DVC
    does (``finetune: deps: ${finetune.checkpoint}``); an entry that does not resolve is skipped."""
    paths = []
    for e in entries or []:
        path = e if isinstance(e, str) else next(iter(e), None) if isinstance(e, dict) else None
        if isinstance(path, str) and "${" in path:
            path = _interpolate(path, params or {})
        if isinstance(path, str) and "${" not in path:
            paths.append(path.rstrip("/"))
    return paths


def _interpolate(text: str, params: dict[str, Any]) -> str | None:
    def value(m):
        node: Any = params
        for key in m.group(1).strip().split("."):
            if not isinstance(node, dict) or key not in node:
                raise KeyError(key)
            node = node[key]
        return str(node)

    try:
        return re.sub(r"\$\{([^}]*)\}", value, text)
    except KeyError:
        return None


def uncached_paths(entries: list[Any] | None) -> set[str]:
    """Paths of dvc.yaml outs marked ``cache: false`` (kept in git, not in the DVC cache)."""
    return {
        path.rstrip("/")
        for e in entries or []
        if isinstance(e, dict)
        for path, opts in e.items()
        if isinstance(opts, dict) and opts.get("cache") is False
    }


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def expand_stages(stages: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """dvc.yaml's ``stages`` with each ``foreach``/``do`` stage expanded as DVC does: one stage
    ``<name>@<key>`` per key of the mapping (or item of the list) ``foreach`` names, ``${key}`` and
    ``${item}`` / ``${item.x}`` filled in (``finetune_variant@frozen``). Other ``${...}`` are left
    for :func:`dvc_paths`."""
    out: dict[str, Any] = {}
    for name, spec in stages.items():
        if not (isinstance(spec, dict) and "foreach" in spec and isinstance(spec.get("do"), dict)):
            out[name] = spec
            continue
        items = spec["foreach"]
        if isinstance(items, str):
            m = re.fullmatch(r"\$\{([^}]*)\}", items.strip())
            items = params
            for key in m.group(1).strip().split(".") if m else ["\0"]:
                items = items.get(key) if isinstance(items, dict) else None
        pairs = (
            list(items.items())
            if isinstance(items, dict)
            else [(str(v), v) for v in items]
            if isinstance(items, list)
            else []
        )
        for key, item in pairs:

            def fill(node: Any, key=key, item=item) -> Any:
                if isinstance(node, dict):
                    return {fill(k): fill(v) for k, v in node.items()}
                if isinstance(node, list):
                    return [fill(v) for v in node]
                if isinstance(node, str):
                    return re.sub(
                        r"\$\{\s*(key|item(?:\.[\w-]+)*)\s*\}",
                        lambda match: str(
                            key if match.group(1) == "key" else _lookup(item, match.group(1).split(".")[1:])
                        ),
                        node,
                    )
                return node

            out[f"{name}@{key}"] = fill(spec["do"])
    return out


def _lookup(node: Any, keys: list[str]) -> Any:
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def dvc_stages(root: str | os.PathLike = ".") -> dict[str, Any]:
    """The stages of ``root``/dvc.yaml, ``foreach`` stages expanded (:func:`expand_stages`); {} when
    there is no readable dvc.yaml."""
    root = Path(root)
    try:
        stages = (yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8")) or {}).get("stages") or {}
        params = (
            yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8")) or {}
            if (root / "params.yaml").is_file()
            else {}
        )
    except (OSError, yaml.YAMLError, AttributeError):
        return {}
    return expand_stages(stages, params if isinstance(params, dict) else {}) if isinstance(stages, dict) else {}


def dvc_lock_upstream(stage: str, root: str | os.PathLike = ".") -> dict[str, Any] | None:
    """The ``dvc.lock`` entries of the stages whose outputs ``stage`` depends on, as they are now.

    ``{upstream stage: {"outs": {path: md5}, "deps": {path: md5}}}``: the outs ``stage`` reads, in the
    DVC cache (not ``cache: false`` metrics and plots, which git keeps), and the upstream stage's data
    deps (not its code: code identity stays in each stage's own record, so an edit that changes no
    output changes no downstream record); ``None`` for a stage that dvc.yaml declares but dvc.lock
    does not list yet. ``dvc repro`` writes a stage's entry
    right after it ran, so when a stage starts its upstream entries name the exact bytes it
    reads. ``None`` outside a DVC project or for a stage dvc.yaml does not know.
    """
    root = Path(root)
    stages = dvc_stages(root)
    try:
        locked = {}
        if (root / "dvc.lock").is_file():
            locked = (yaml.safe_load((root / "dvc.lock").read_text(encoding="utf-8")) or {}).get("stages") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    if not isinstance(stages.get(stage), dict):
        return None
    try:
        params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        params = {}
    deps = dvc_paths(stages[stage].get("deps"), params if isinstance(params, dict) else {})
    found: dict[str, Any] = {}
    for name, spec in stages.items():
        if name == stage or not isinstance(spec, dict):
            continue
        declared = (spec.get("outs") or []) + (spec.get("metrics") or []) + (spec.get("plots") or [])
        if not any(_overlaps(o, d) for o in dvc_paths(declared) for d in deps):
            continue
        entry = locked.get(name)
        if not isinstance(entry, dict):
            found[name] = None
            continue
        uncached = uncached_paths(declared)
        entries = {role: [e for e in entry.get(role) or [] if isinstance(e, dict)] for role in ("outs", "deps")}
        found[name] = {
            "outs": {
                e["path"]: e.get("md5")
                for e in entries["outs"]
                if e.get("path") not in uncached and any(_overlaps(str(e.get("path")), d) for d in deps)
            },
            "deps": {e["path"]: e.get("md5") for e in entries["deps"] if not str(e.get("path")).endswith(".py")},
        }
    return found
