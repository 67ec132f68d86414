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
same code, params and data write the same record bytes and leave ``dvc.lock`` unchanged. That
part is the stage's **run log** (:func:`build_run_log`): git commit and dirty paths, pipeline-run
and MLflow run ids, start and finish times, host, durations and throughput. It goes to MLflow
(tags, metrics and the ``provenance/run.json`` artifact) and to ``runs/<stage>.json`` in the
working copy (git-ignored, not a DVC output), and names the record it belongs to by
:func:`record_digest` (MLflow tag ``bertrace.record_sha256``), so ``bertrace trace`` finds it
locally or on a shared tracking server (docs/provenance.md, "Records and run logs").
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import subprocess
import sys
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import yaml

from pipeline.core.io import canonical_json, sha256_bytes, sha256_file, sha256_json

RECORD_VERSION = 2  # 2: the run fields (git, times, run ids) moved to the run log; ``code`` added
RUN_LOG_DIR = Path("runs")  # runs/<stage>.json: the latest run log of each stage in this working copy
RECORD_TAG = "bertrace.record_sha256"  # MLflow tag: record_digest() of the record a run wrote
# What a run log adds to its record when a consumer shows both (trace, scorecard, evaluation.md).
RUN_FIELDS = ("git", "pipeline_run_id", "mlflow_run_id", "started", "finished", "seconds", "host")

# Paths that change *because* the pipeline runs; they do not make the code tree dirty.
_RUN_PRODUCTS = (
    "dvc.lock",
    "metrics/",
    "plots/",
    "reports/",
    "runs/",
    "mlflow.db",
    "mlruns/",
    "mlartifacts/",
    ".dvc/.gitignore",
    ".dvc/tmp/",
    ".dvc/cache/",
)

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


def git_state(repo_dir: str | os.PathLike = ".") -> dict[str, Any]:
    """Commit hash and dirty flag of the git tree at ``repo_dir`` (``None`` outside git).

    Changes to run products (``dvc.lock``, ``metrics/`` …) do not count as dirty: ``dvc repro``
    rewrites them while it runs.
    """

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo_dir, check=True, capture_output=True, text=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return {"commit": None, "dirty": None, "dirty_paths": []}
    try:
        status = git("status", "--porcelain", "--untracked-files=normal")
    except subprocess.CalledProcessError:
        status = ""
    dirty = []
    for line in status.splitlines():
        if not line.strip():
            continue
        code, path = line[:2], line[3:].strip().strip('"')
        if path.startswith(_RUN_PRODUCTS):
            continue
        if code == "??" and path.startswith("data/"):
            continue  # a DVC output not yet in data/.gitignore (DVC adds it after the stage ran)
        dirty.append(path)
    state = {"commit": commit, "dirty": bool(dirty), "dirty_paths": dirty[:20]}
    experiment = dvc_experiment(repo_dir)
    if experiment is not None:
        # `dvc exp run` commits the workspace (params.yaml as -S set it, any other change) to the
        # experiment's ref when the run ends: the changes are in a commit, the tree is not dirty.
        experiment["changed_paths"] = dirty[:20]
        state.update(dirty=False, dirty_paths=[], experiment=experiment)
    return state


def dvc_experiment(repo_dir: str | os.PathLike = ".") -> dict[str, Any] | None:
    """The DVC experiment this stage runs in, or None outside ``dvc exp run``.

    DVC sets ``DVC_EXP_NAME`` and ``DVC_EXP_BASELINE_REV`` (the commit the experiment starts
    from) for every stage of ``dvc exp run`` (workspace, ``--temp`` and ``--queue``;
    dvc/repo/experiments/queue/base.py). The experiment's commit is saved as the git ref
    ``refs/exps/<baseline[:2]>/<baseline[2:]>/<name>``; ``params_diff`` is ``{key: [baseline, now]}``
    of params.yaml (dotted keys), what ``-S`` changed."""
    name, baseline = os.environ.get("DVC_EXP_NAME"), os.environ.get("DVC_EXP_BASELINE_REV")
    if not name or not baseline:
        return None
    return {
        "name": name,
        "baseline_rev": baseline,
        "ref": f"refs/exps/{baseline[:2]}/{baseline[2:]}/{name}",
        "params_diff": _params_diff(repo_dir, baseline),
    }


def _params_diff(repo_dir: str | os.PathLike, baseline: str, params_file: str = "params.yaml") -> dict[str, list]:
    def flat(obj: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(obj, dict) and obj:
            return {k: v for key, value in obj.items() for k, v in flat(value, f"{prefix}{key}.").items()}
        return {prefix[:-1]: obj}

    try:
        now = yaml.safe_load(Path(repo_dir, params_file).read_text(encoding="utf-8")) or {}
        before = None
        for where in (repo_dir, os.environ.get("DVC_ROOT")):  # a temp workspace may lack the baseline's objects
            if not where:
                continue
            proc = subprocess.run(
                ["git", "show", f"{baseline}:{params_file}"], cwd=where, capture_output=True, text=True
            )
            if proc.returncode == 0:
                before = yaml.safe_load(proc.stdout) or {}
                break
    except (OSError, yaml.YAMLError):
        return {}
    if before is None:
        return {}
    a, b = flat(before), flat(now)
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


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


def _proc_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pipeline_run_id() -> str:
    """An id shared by every stage of one ``dvc repro``.

    ``BERTRACE_PIPELINE_RUN_ID`` wins when set. Otherwise the nearest ancestor process that
    is DVC (Linux ``/proc``) identifies the run by its pid and start time. A stage run on
    its own gets a fresh id.
    """
    if os.environ.get("BERTRACE_PIPELINE_RUN_ID"):
        return os.environ["BERTRACE_PIPELINE_RUN_ID"]
    pid = os.getppid()
    for _ in range(12):
        if pid <= 1:
            break
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        if any(
            os.path.basename(part.decode(errors="replace")) == "dvc" or part.endswith(b"/dvc") or part == b"dvc"
            for part in cmdline[:3]
        ) or (len(cmdline) > 2 and cmdline[1:3] == [b"-m", b"dvc"]):
            return sha256_bytes(f"dvc:{pid}:{_proc_start_time(pid)}".encode())[:16]
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return uuid.uuid4().hex[:16]


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


def code_hashes(stage: str, root: str | os.PathLike = ".") -> dict[str, str]:
    """``{path: sha256}`` of the Python files ``stage`` lists as deps in ``root``/dvc.yaml (its
    import closure, tests/unit/test_dvc_deps.py); {} for a stage dvc.yaml does not know."""
    root = Path(root)
    spec = dvc_stages(root).get(stage)
    if not isinstance(spec, dict):
        return {}
    return {p: sha256_file(root / p) for p in dvc_paths(spec.get("deps")) if p.endswith(".py") and (root / p).is_file()}


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def build_run_log(
    record: dict[str, Any],
    *,
    git: dict[str, Any],
    run_id: str | None,
    mlflow_run_id: str | None,
    tracking: str | None,
    started: str | None,
    seconds: float | None,
    timings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run log of the run that wrote ``record``: when, where, from which commit and under which
    run ids (the module docstring). ``tracking``: the MLflow tracking URI, credentials removed."""
    return {
        "stage": record.get("stage"),
        "record_sha256": record_digest(record),
        "git": git,
        "pipeline_run_id": run_id,
        "mlflow_run_id": mlflow_run_id,
        "tracking_uri": tracking,
        "started": started,
        "finished": now_utc(),
        "seconds": None if seconds is None else round(seconds, 2),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "timings": timings or {},
    }


def read_run_log(
    stage: str, record: dict[str, Any] | None = None, root: str | os.PathLike = "."
) -> dict[str, Any] | None:
    """``runs/<stage>.json`` under ``root`` when it belongs to ``record`` (same :func:`record_digest`;
    any run log of the stage when ``record`` is None), else None."""
    import json

    path = Path(root) / RUN_LOG_DIR / f"{stage}.json"
    try:
        log = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(log, dict) or (record is not None and log.get("record_sha256") != record_digest(record)):
        return None
    return log


def with_run(record: dict[str, Any], run_log: dict[str, Any] | None) -> dict[str, Any]:
    """``record`` with its run log's :data:`RUN_FIELDS` laid over it, for display (a copy)."""
    if not run_log:
        return record
    return {**record, **{k: run_log[k] for k in RUN_FIELDS if run_log.get(k) is not None}}


def without_run(record: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`with_run`: ``record`` without the run fields a display laid over it."""
    return {k: v for k, v in record.items() if k not in RUN_FIELDS}


def record_digest(record: dict[str, Any]) -> str:
    return sha256_bytes(canonical_json(record).encode())


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

    ``{upstream stage: {"outs": {path: md5}, "deps": {path: md5}}}``, outs in the DVC cache only
    (not ``cache: false`` metrics and plots, which git keeps), ``None`` for a stage that
    dvc.yaml declares but dvc.lock does not list yet). ``dvc repro`` writes a stage's entry
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
        found[name] = {
            role: {
                e["path"]: e.get("md5")
                for e in entry.get(role) or []
                if isinstance(e, dict) and not (role == "outs" and e.get("path") in uncached)
            }
            for role in ("outs", "deps")
        }
    return found
