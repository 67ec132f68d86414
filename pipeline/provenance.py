"""Provenance records: what code, params and input bytes produced an output.

Every stage writes one record (``data/provenance/<stage>.json``). A record names the git
commit (and whether the tree was dirty), the stage's params and their hash, the sha256 of
every input it read and every output it wrote, library versions, and — embedded — the
records of the upstream stages whose outputs it consumed. A checkpoint therefore carries
the whole chain back to the raw corpus.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.io import canonical_json, sha256_bytes, sha256_file, sha256_json

RECORD_VERSION = 1

# Paths that change *because* the pipeline runs; they do not make the code tree dirty.
_RUN_PRODUCTS = ("dvc.lock", "metrics/", "plots/", "reports/", "mlflow.db", "mlruns/")

LIBRARIES = (
    "torch", "tokenizers", "datasets", "pyarrow", "pandas", "numpy",
    "mlflow", "great-expectations", "dvc", "transformers",
)


def git_state(repo_dir: str | os.PathLike = ".") -> dict[str, Any]:
    """Commit hash and dirty flag of the git tree at ``repo_dir`` (``None`` outside git).

    Changes to run products (``dvc.lock``, ``metrics/`` …) do not count as dirty: ``dvc repro``
    rewrites them while it runs.
    """
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=repo_dir, check=True, capture_output=True, text=True
        ).stdout

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
    return {"commit": commit, "dirty": bool(dirty), "dirty_paths": dirty[:20]}


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
        if any(os.path.basename(part.decode(errors="replace")) == "dvc" or part.endswith(b"/dvc")
               or part == b"dvc" for part in cmdline[:3]) or (
            len(cmdline) > 2 and cmdline[1:3] == [b"-m", b"dvc"]
        ):
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
    extra: dict[str, Any] | None = None,
    run_id: str | None = None,
    mlflow_run_id: str | None = None,
    started: str | None = None,
) -> dict[str, Any]:
    """Assemble one provenance record (a plain, JSON-able dict)."""
    record = {
        "record_version": RECORD_VERSION,
        "stage": stage,
        "git": git_state(),
        "params": params,
        "params_hash": params_hash(params),
        "inputs": dict(sorted(inputs.items())),
        "outputs": dict(sorted(outputs.items())),
        "upstream": upstream or {},
        "libraries": library_versions(),
        "platform": {"python": sys.version.split()[0], "machine": platform.machine(), "system": platform.system()},
        "pipeline_run_id": run_id,
        "mlflow_run_id": mlflow_run_id,
        "started": started,
        "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if extra:
        record.update(extra)
    return record


def record_digest(record: dict[str, Any]) -> str:
    return sha256_bytes(canonical_json(record).encode())
