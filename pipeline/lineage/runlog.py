"""Run logs: when, where and by which runs a stage ran — everything a record leaves out.

A provenance record (:mod:`pipeline.lineage.provenance`) is a function of a stage's code, params and
input bytes, so a rebuild writes the same bytes. The **run log** holds the rest: git commit and
dirty paths, pipeline-run and MLflow run ids, start and finish times, host, durations and
throughput (``timings``). It is written to ``runs/<stage>.json`` in the working copy (git-ignored,
not a DVC output) and to MLflow (tags, metrics, the ``provenance/run.json`` artifact), and names
the record it belongs to by :func:`pipeline.lineage.provenance.record_digest` (MLflow tag
``bertrace.record_sha256``), so ``bertrace trace`` finds it locally or on a shared tracking server.

This module only logs: no DVC output is computed from it, so it is not a code dep of any stage
(``tests/unit/test_dvc_deps.py``, ``OUTPUT_NEUTRAL``); editing it reruns nothing.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.io import sha256_bytes, write_json
from pipeline.lineage.provenance import record_digest

RUN_LOG_DIR = Path("runs")  # runs/<stage>.json: the latest run log of each stage in this working copy
RECORD_TAG = "bertrace.record_sha256"  # MLflow tag: record_digest() of the record a run wrote
# MLflow tag: record_digest() of the record the run's checkpoints embed (a checkpoint travels without its run log)
CHECKPOINT_RECORD_TAG = "bertrace.checkpoint_record_sha256"
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
    checkpoint_record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run log of the run that wrote ``record`` (and the checkpoints that embed
    ``checkpoint_record``): when, where, from which commit and under which run ids (the module
    docstring). ``tracking``: the MLflow tracking URI, credentials removed."""
    return {
        "stage": record.get("stage"),
        "record_sha256": record_digest(record),
        "checkpoint_record_sha256": None if checkpoint_record is None else record_digest(checkpoint_record),
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


def write_run_log(name: str, log: dict[str, Any], root: str | os.PathLike = ".") -> Path:
    """Write ``log`` as ``root``/runs/``name`` (atomically)."""
    path = Path(root) / RUN_LOG_DIR / name
    write_json(path, log)
    return path


def read_run_log(
    stage: str, record: dict[str, Any] | None = None, root: str | os.PathLike = "."
) -> dict[str, Any] | None:
    """``runs/<stage>.json`` under ``root`` when it belongs to ``record`` (its :func:`record_digest` is
    the log's ``record_sha256`` or ``checkpoint_record_sha256``: the stage's record or the one its
    checkpoints embed; any run log of the stage when ``record`` is None), else None."""
    path = Path(root) / RUN_LOG_DIR / f"{stage}.json"
    try:
        log = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(log, dict):
        return None
    if record is not None and record_digest(record) not in (
        log.get("record_sha256"),
        log.get("checkpoint_record_sha256"),
    ):
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
