"""MLflow plumbing: where runs go, how params/tags/metrics are named, stale runs.

Default store: a SQLite file ``mlflow.db`` in the working directory (the repo root when DVC
runs a stage; the original repository's root for ``dvc exp run --temp`` / ``--queue``, see
:func:`store_root`) with artifacts under ``mlartifacts/``; ``MLFLOW_TRACKING_URI`` overrides both
(any server or store MLflow supports). The experiment is ``bertrace`` unless
``MLFLOW_EXPERIMENT_NAME`` says otherwise.

Names. MLflow accepts param, tag and metric keys of at most 250 characters made of
alphanumerics, ``_ - . / space`` (and ``:`` except on Windows) that do not resolve to another
path (no ``//``, ``./``, leading ``/``). User strings reach those names: corpus file names
(``bertrace.input.<file>``), column renames and split names (params), label names (per-class
metrics). :func:`mlflow_name` is the one function every such key goes through: a key that is
valid ASCII stays as it is; any other becomes a valid ASCII key (accents dropped, other
characters ``_``) followed by ``-`` and 10 hex digits of the sha256 of the original, so it is
stable (same input, same name, on every machine and version), collision-free (two originals
never share a name) and never longer than the limit. The stage keeps the originals of renamed
keys in the run's ``names.json`` artifact (mapped name → original).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import posixpath
import re
import resource
import shutil
import socket
import sys
import tempfile
import time
import unicodedata
from pathlib import Path
from typing import Any

from pipeline.core.errors import BertraceError
from pipeline.lineage import provenance as prov
from pipeline.lineage import runlog

DEFAULT_EXPERIMENT = "bertrace"
MAX_PARAM_CHARS = 6000  # MLflow's limit on one param value
MAX_TAG_CHARS = 5000  # MLflow's limit on one tag value (8000 in MLflow 3, 5000 before)
MAX_KEY_CHARS = 250  # MLflow's limit on a param, tag or metric key
HASH_CHARS = 10  # hex digits of the original's sha256 appended to a renamed key
_VALID = re.compile(r"[A-Za-z0-9_.\- /]*")  # portable: MLflow's set without ':' (refused on Windows)
_INVALID_RUN = re.compile(r"[^A-Za-z0-9_.\- /]+")  # a run of other characters becomes one "_"
_NOT_ASCII = "\x00"  # stands for a character with no ASCII form, until _INVALID_RUN replaces it


def store_root(root: str | os.PathLike = ".") -> Path:
    """Where the default store lives: ``root``, except that the working directory of a DVC
    experiment's temporary workspace (``dvc exp run --temp`` / ``--queue``: a copy under
    ``.dvc/tmp/exps/``, removed afterwards) stands for the repository DVC was started in
    (``DVC_ROOT``), so every run of every experiment lands in the repository's one store."""
    if str(root) == "." and os.environ.get("DVC_ROOT"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    return Path(root).resolve()


def default_tracking_uri(root: str | os.PathLike = ".") -> str:
    return "sqlite:///" + str(store_root(root) / "mlflow.db")


def tracking_uri(root: str | os.PathLike = ".") -> str:
    """``MLFLOW_TRACKING_URI`` when set, else ``<root>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(root)


def redacted_uri(uri: str | None) -> str | None:
    """``uri`` without credentials: user info (``user:password@``) and password-like query
    parameters removed, for logs, records and error messages."""
    if not uri:
        return uri
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(uri)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = urlencode(
        [
            (k, "***" if re.search(r"pass|secret|token|key", k, re.I) else v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ]
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def check_server(uri: str, experiment: str = DEFAULT_EXPERIMENT, timeout: float = 10.0) -> None:
    """For an ``http(s)://`` tracking URI: one request that the server answers and accepts this
    client's credentials (``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` / ``_TOKEN``, or the
    ``user:password@`` of the URI, as MLflow's client takes them), so a stage fails in seconds,
    before it writes anything, instead of after MLflow's retries. Raises
    :class:`~pipeline.core.errors.BertraceError` naming ``MLFLOW_TRACKING_URI`` (without its
    password) and the fix."""
    import urllib.error
    import urllib.parse
    import urllib.request

    if not uri.startswith(("http://", "https://")):
        return
    shown = redacted_uri(uri)
    parts = urllib.parse.urlsplit(uri)
    url = (
        urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1])).rstrip("/")
        + "/api/2.0/mlflow/experiments/get-by-name?"
        + urllib.parse.urlencode({"experiment_name": experiment})
    )
    request = urllib.request.Request(url)
    auth = _authorization(parts)
    if auth:
        request.add_header("Authorization", auth)
    offline = (
        "; start it (`make team-up` for a local trial), or unset MLFLOW_TRACKING_URI to log to "
        "./mlflow.db, or set BERTRACE_NO_MLFLOW=1 to run without tracking"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return
    except urllib.error.HTTPError as e:
        if e.code == 404:  # no such experiment yet: the server answered
            return
        if e.code in (401, 403):
            raise BertraceError(
                f"MLFLOW_TRACKING_URI={shown}: the server refused this client's credentials "
                f"(HTTP {e.code}); set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
                "(or MLFLOW_TRACKING_TOKEN) to an account it knows"
            ) from None
        raise BertraceError(
            f"MLFLOW_TRACKING_URI={shown}: the tracking server answered HTTP {e.code} "
            f"({e.reason}); check its log and its database{offline}"
        ) from None
    except (urllib.error.URLError, OSError) as e:
        reason = _unreachable(parts, getattr(e, "reason", e), timeout)
        raise BertraceError(f"MLFLOW_TRACKING_URI={shown}: no MLflow server answers ({reason}){offline}") from None


def _authorization(parts) -> str | None:
    """The ``Authorization`` header MLflow's client would send: a token, else the username and
    password of the environment, else those of the URI's user info."""
    import base64
    from urllib.parse import unquote

    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"
    if os.environ.get("MLFLOW_TRACKING_USERNAME"):
        pair = f"{os.environ['MLFLOW_TRACKING_USERNAME']}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}"
    elif parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    else:
        return None
    return "Basic " + base64.b64encode(pair.encode()).decode()


def _unreachable(parts, reason: Any, timeout: float) -> str:
    """Why nothing answered, in words that point at the fix: the host name, the port, the wait."""
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname  # IPv6 in brackets
    where = f"{host}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    if isinstance(reason, socket.gaierror):
        return f"the host name {parts.hostname!r} does not resolve"
    if isinstance(reason, ConnectionRefusedError):
        return f"connection refused: nothing listens on {where}"
    if isinstance(reason, TimeoutError | socket.timeout):
        return f"no answer from {where} within {timeout:g} s"
    text = str(reason)
    if parts.password:
        text = text.replace(parts.password, "***")
    return text


def setup_mlflow(root: str | os.PathLike = "."):
    """Point MLflow at the configured store and return the experiment id."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    import mlflow

    explicit = bool(os.environ.get("MLFLOW_TRACKING_URI"))  # read first: set_tracking_uri sets the variable
    uri = tracking_uri(root)
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_EXPERIMENT)
    check_server(uri, name)
    mlflow.set_tracking_uri(uri)
    try:
        experiment = mlflow.get_experiment_by_name(name)
    except Exception as e:  # noqa: BLE001 - a database URI that does not connect, a store that is not MLflow's
        detail = (str(e).strip().splitlines() or [""])[0][:160]
        from urllib.parse import urlsplit

        if urlsplit(uri).password:
            detail = detail.replace(urlsplit(uri).password, "***")
        raise BertraceError(
            f"MLFLOW_TRACKING_URI={redacted_uri(uri)}: the tracking store did not answer "
            f"({type(e).__name__}: {detail}); check that it "
            "is running and reachable, or unset MLFLOW_TRACKING_URI to log to ./mlflow.db"
        ) from None
    if experiment is not None:
        return experiment.experiment_id
    artifact_location = None
    if not explicit:
        artifact_location = (store_root(root) / "mlartifacts").as_uri()
    try:
        return mlflow.create_experiment(name, artifact_location=artifact_location)
    except Exception:  # created concurrently by another stage
        return mlflow.get_experiment_by_name(name).experiment_id


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """``{"model": {"preset": "mini"}}`` → ``{"model.preset": "mini"}`` (lists stay values)."""
    flat: dict[str, Any] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            flat.update(flatten(value, name))
    else:
        flat[prefix] = obj
    return flat


# ---------------------------------------------------------------------------------------------
# Names


def is_valid_name(name: str, max_chars: int = MAX_KEY_CHARS) -> bool:
    """Whether MLflow takes ``name`` as a key as it is, on every platform and store."""
    if not name or len(name) > max_chars or not _VALID.fullmatch(name):
        return False
    norm = posixpath.normpath(name)
    return norm == name and norm != "." and not norm.startswith("..") and not norm.startswith("/")


def mlflow_name(name: Any, max_chars: int = MAX_KEY_CHARS) -> str:
    """``name`` as a valid MLflow key: unchanged when valid, else a stable, collision-free rename
    (see the module docstring), e.g. ``"Stars (1-5)"`` → ``"Stars _1-5_-<10 hex>"``."""
    name = str(name)
    if is_valid_name(name, max_chars):
        return name
    suffix = "-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    readable = _path_segments(_INVALID_RUN.sub("_", _ascii(name)))
    readable = _path_segments(readable[: max(0, max_chars - len(suffix))]) or "_"
    out = readable + suffix
    assert is_valid_name(out, max_chars), (name, out)
    return out


def _ascii(text: str) -> str:
    """Latin letters without their accents (``é`` → ``e``); other characters as they are."""
    out = []
    for ch in text:
        if ch.isascii():
            out.append(ch)
            continue
        base = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode("ascii")
        out.append(base if base and base.isalnum() else _NOT_ASCII)
    return "".join(out)


def _path_segments(text: str) -> str:
    """``text`` with no empty, ``.`` or ``..`` path segment and no leading or trailing ``/``."""
    parts = []
    for part in text.split("/"):
        if part in ("", ".", ".."):
            part = "_" * len(part) if part else ""
        if part:
            parts.append(part)
    return "/".join(parts)


def mlflow_params(params: dict[str, Any], renamed: dict[str, str] | None = None) -> dict[str, str]:
    """Flattened params as MLflow params: keys through :func:`mlflow_name`, values as text cut
    to MLflow's limit. ``renamed`` (if given) collects ``{mapped: original}`` of renamed keys."""
    return {_key(k, renamed): _cut(str(v), MAX_PARAM_CHARS) for k, v in flatten(params).items()}


def mlflow_tags(tags: dict[str, Any], renamed: dict[str, str] | None = None) -> dict[str, str]:
    """Tags with valid keys and values cut to MLflow's limit (the original names in ``renamed``)."""
    return {_key(k, renamed): _cut(str(v), MAX_TAG_CHARS) for k, v in tags.items()}


def mlflow_metrics(metrics: dict[str, Any], renamed: dict[str, str] | None = None) -> dict[str, float]:
    """The numbers of a (nested) metrics dict, flattened, with valid keys; booleans, text and
    None are left out."""
    out = {}
    for k, v in flatten(metrics).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[_key(k, renamed)] = float(v)
    return out


def mlflow_artifact_path(path: str | None) -> str | None:
    """An artifact folder (``evaluation``, ``provenance`` ...) as a safe relative path."""
    return None if path in (None, "") else mlflow_name(path)


def _key(key: Any, renamed: dict[str, str] | None) -> str:
    name = mlflow_name(key)
    if renamed is not None and name != str(key):
        renamed[name] = str(key)
    return name


def _cut(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------
# Runs left RUNNING by killed stages

PROCESS_TAG = "bertrace.process"  # "<host> <pid> <process start time>": which process owns a RUNNING run


def process_id(pid: int | None = None) -> str:
    """This process (or ``pid``) as ``"<host> <pid> <start time>"``; the start time (clock ticks
    since boot, Linux) tells a live process from a later one that reuses the pid."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()} {pid} {_start_time(pid) or 0}"


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_alive(ident: str) -> bool | None:
    """Whether the process a :func:`process_id` names still runs: None when that cannot be told
    here (another host, or a malformed id)."""
    try:
        host, pid_s, start_s = ident.split(" ")
        pid, start = int(pid_s), int(start_s)
    except ValueError:
        return None
    if host != socket.gethostname():
        return None
    if Path("/proc/self/stat").exists():
        now = _start_time(pid)
        return now is not None and (start == 0 or now == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def close_stale_runs(client, experiment_id: str, stage: str, pipeline_run_id: str) -> list[str]:
    """Mark ``KILLED`` the runs of ``stage`` that are still ``RUNNING`` although their process is
    gone (killed: SIGKILL, power loss, OOM), and their nested runs.

    A run is stale when its process (:data:`PROCESS_TAG`, checked on this host) no longer runs, or
    when it belongs to the same pipeline run (``bertrace.pipeline_run_id``) as the stage now
    starting: the same ``dvc repro`` runs a stage once. Runs of other hosts whose pipeline run
    differs are left alone (they may be alive). Returns the run ids marked."""
    stale: list[str] = []
    running = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=5000)
    by_id = {r.info.run_id: r for r in running}
    for r in running:
        tags = r.data.tags
        if tags.get("bertrace.stage") != stage or ("mlflow.parentRunId" in tags and tags.get(KIND_TAG) != "stage"):
            continue  # another stage's run, or a nested one (a seed's): its stage run's status decides
        alive = process_alive(tags[PROCESS_TAG]) if PROCESS_TAG in tags else None
        if alive is False or (alive is None and tags.get("bertrace.pipeline_run_id") == pipeline_run_id):
            stale.append(r.info.run_id)
    children = [rid for rid, r in by_id.items() if r.data.tags.get("mlflow.parentRunId") in stale]
    for rid in stale + children:
        client.set_tag(
            rid,
            "bertrace.killed",
            "its process ended without closing the run (killed); marked KILLED when the stage started again",
        )
        client.set_terminated(rid, status="KILLED")
    return stale + children


# ---------------------------------------------------------------------------------------------
# One parent run per pipeline run
#
# Rule: every stage of one pipeline run nests its run under the parent run whose tag
# ``bertrace.pipeline`` is the pipeline-run id (:func:`pipeline.lineage.provenance.pipeline_run_id`: the
# ``dvc repro`` / ``dvc exp run`` process that started the stage, or ``BERTRACE_PIPELINE_RUN_ID``);
# the first stage to start creates it. Stages are separate processes; the id is the only thing they
# share, and it is the same one their provenance records carry. A stage run outside DVC (``python
# -m stages.x`` with neither ``DVC_STAGE`` nor ``BERTRACE_PIPELINE_RUN_ID`` set) is no pipeline
# run: it stays a top-level run.
#
# The parent holds, for side-by-side comparison of two pipeline runs, every stage's params
# (``<stage>.<param>``) and the numbers of its DVC metrics files (``<stage>.<metric>``). A stage that
# DVC did not rerun (its outputs came from an earlier pipeline run) has no run under this parent:
# the parent gets the tag ``bertrace.reused.<stage>`` = the MLflow run id that made its outputs (from
# the stage's provenance record), its params and metrics, and a link in the run's description.

KIND_TAG = "bertrace.run_kind"  # "pipeline" on a parent, "stage" on a stage run under one
PIPELINE_TAG = "bertrace.pipeline"  # on the parent: the pipeline-run id (stage runs: bertrace.pipeline_run_id)
REUSED_PREFIX = "bertrace.reused."  # + stage: the MLflow run that made the outputs this pipeline run reused
NOTE_TAG = "mlflow.note.content"  # the run's description in the MLflow UI


def in_pipeline() -> bool:
    """Whether this stage runs as part of a pipeline run (under DVC, or with an explicit id)."""
    return bool(os.environ.get("DVC_STAGE") or os.environ.get("BERTRACE_PIPELINE_RUN_ID"))


def _quote(value: str) -> str:
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def pipeline_parent(
    client, experiment_id: str, pipeline_run_id: str, *, run_name: str | None = None, tags: dict[str, str] | None = None
) -> str:
    """The id of the parent run of pipeline run ``pipeline_run_id``, created when absent."""
    found = client.search_runs(
        [experiment_id],
        max_results=1,
        order_by=["attributes.start_time ASC"],
        filter_string=f"tags.`{KIND_TAG}` = 'pipeline' and tags.`{PIPELINE_TAG}` = {_quote(pipeline_run_id)}",
    )
    if found:
        return found[0].info.run_id
    run = client.create_run(
        experiment_id,
        run_name=mlflow_name(run_name or f"pipeline {pipeline_run_id[:8]}"),
        tags=mlflow_tags({KIND_TAG: "pipeline", PIPELINE_TAG: pipeline_run_id, **(tags or {})}),
    )
    return run.info.run_id


def stage_metrics(stage: str, root: str | os.PathLike = ".") -> dict[str, float]:
    """The numbers of the DVC metrics files dvc.yaml declares for ``stage``, flattened
    (``{"dev_acc": 0.81}``); {} when there are none or they are unreadable."""
    import json

    import yaml

    try:
        spec = ((yaml.safe_load(Path(root, "dvc.yaml").read_text(encoding="utf-8")) or {}).get("stages") or {})[stage]
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return {}
    out: dict[str, float] = {}
    for entry in (spec or {}).get("metrics") or []:
        path = Path(root, next(iter(entry)) if isinstance(entry, dict) else str(entry))
        try:
            out.update(mlflow_metrics(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            continue
    return out


def log_stage_on_parent(
    client, parent_id: str, stage: str, *, params: dict[str, Any] | None = None, metrics: dict[str, float] | None = None
) -> None:
    """``<stage>.<param>`` params and ``<stage>.<metric>`` metrics on the parent run (best effort:
    a param logged before with another value, e.g. by a retried stage, is kept as it was)."""
    from mlflow.entities import Metric, Param

    prefixed = {mlflow_name(f"{stage}.{k}"): v for k, v in mlflow_params(params or {}).items()}
    try:
        logged = client.get_run(parent_id).data.params
    except Exception:  # noqa: BLE001
        logged = {}
    items = [Param(k, v) for k, v in sorted(prefixed.items()) if k not in logged]
    for i in range(0, len(items), 100):
        try:
            client.log_batch(parent_id, params=items[i : i + 100])
        except Exception:  # noqa: BLE001 - a concurrent writer logged the same key first
            pass
    import time

    now = int(time.time() * 1000)
    values = [Metric(mlflow_name(f"{stage}.{k}"), float(v), now, 0) for k, v in sorted((metrics or {}).items())]
    for i in range(0, len(values), 1000):
        client.log_batch(parent_id, metrics=values[i : i + 1000])


def run_for_record(client, experiment_ids: list[str], record: dict[str, Any]) -> str | None:
    """Id of the newest MLflow run tagged with ``record``'s digest, as the record it wrote or as
    the one its checkpoints embed (the run that made it, on this or a teammate's machine when they
    share a tracking server), else None."""
    digest = prov.record_digest(record)
    for tag in (runlog.RECORD_TAG, runlog.CHECKPOINT_RECORD_TAG):
        try:
            runs = client.search_runs(
                experiment_ids,
                filter_string=f"tags.`{tag}` = '{digest}'",
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
        except Exception:  # noqa: BLE001 - a lookup for display; no answer is an answer
            return None
        if runs:
            return runs[0].info.run_id
    return None


# The parent run's reused.<stage> tag when no run of this store made that stage's outputs.
UNKNOWN_MAKER = "unknown: no run in this MLflow store made it (made in another clone, or restored by DVC)"


def link_reused(
    client,
    parent_id: str,
    experiment_id: str,
    records: dict[str, dict[str, Any]],
    pipeline_run_id: str,
    root: str | os.PathLike = ".",
) -> list[str]:
    """Tag the parent with the runs that made the outputs of upstream stages DVC did not rerun in
    this pipeline run (``records``: their provenance records); returns those stages."""
    reused = []
    tags = client.get_run(parent_id).data.tags
    for stage, rec in sorted(records.items()):
        if not isinstance(rec, dict) or rec.get("pipeline_run_id") == pipeline_run_id:
            continue
        key = mlflow_name(REUSED_PREFIX + stage)
        made_by = (
            rec.get("mlflow_run_id")
            or run_for_record(client, [experiment_id], runlog.without_run(rec))
            or UNKNOWN_MAKER
        )
        if tags.get(key) != made_by:
            client.set_tag(parent_id, key, made_by)
            log_stage_on_parent(
                client,
                parent_id,
                stage,
                params=rec.get("params") if isinstance(rec.get("params"), dict) else None,
                metrics=stage_metrics(stage, root),
            )
        reused.append(stage)
    if reused:
        tags = client.get_run(parent_id).data.tags
        lines = ["Stages this pipeline run reused (DVC did not rerun them); the runs that made their outputs:", ""]
        for key, run_id in sorted(tags.items()):
            if key.startswith(REUSED_PREFIX):
                link = f"[{run_id}](#/experiments/{experiment_id}/runs/{run_id})" if len(run_id) == 32 else run_id
                lines.append(f"- {key[len(REUSED_PREFIX) :]}: {link}")
        client.set_tag(parent_id, NOTE_TAG, "\n".join(lines))
    return reused


# ---------------------------------------------------------------------------------------------
# One stage's MLflow run and run log


CHILD_TAGS = ("bertrace.git_", "bertrace.params_hash", "bertrace.pipeline_run_id", prov.CHAIN_TAG_PREFIX)
MAX_FILE_TAGS = 16  # per-file bertrace.input.* / bertrace.output.* tags per run; all files: the files.json artifact
PROVENANCE_ARTIFACT_DIR = "provenance"  # MLflow artifact folder of the provenance record


def peak_rss_mb() -> float:
    """Peak resident memory of this process and its finished children, in MiB (Linux: KiB units)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024.0


class StageLog:
    """What one stage execution logs and never writes into a DVC output: its MLflow run and its run
    log (:mod:`pipeline.lineage.runlog`). ``stages.common.StageRun`` owns one and hands it what it
    records; this class only reports it.

    Opens an MLflow run tagged with the stage, git commit, dirty flag, params hash and the
    pipeline-run id shared by all stages of one ``dvc repro``; keeps the ``bertrace.chain.*`` tags
    (tokenizer, examples, checkpoint hashes, :func:`pipeline.lineage.provenance.chain_ids`) current on
    the run and its child runs; on exit logs wall time and peak memory and closes the run (FAILED when
    an exception escapes, KILLED when interrupted or terminated).

    Every name that reaches MLflow goes through :func:`mlflow_name`; renamed ones are listed with
    their originals in the ``names.json`` artifact, and every input and output file (path → sha256) in
    ``files.json`` (per-file tags only for the first ``MAX_FILE_TAGS`` files). On start, runs of this
    stage that a killed process left ``RUNNING`` are marked ``KILLED`` (:func:`close_stale_runs`).

    Under DVC the run is nested in its pipeline run's parent run (:func:`pipeline_parent`), which
    gets the stage's params and metrics and links the upstream stages DVC did not rerun
    (``bertrace.reused.<stage>``)."""

    def __init__(
        self,
        stage: str,
        params: dict[str, Any],
        *,
        dvc_lock: dict[str, Any] | None,
        enabled: bool = True,
        run_name: str | None = None,
        system_metrics: bool = False,
    ):
        self.stage, self.params, self.dvc_lock = stage, params, dvc_lock
        self.enabled = enabled and os.environ.get("BERTRACE_NO_MLFLOW") != "1"
        self.run_name = run_name or stage
        self.system_metrics = system_metrics  # MLflow's sampler: CPU, memory, GPU every 10 s
        self.timings: dict[str, Any] = {}  # durations and throughput: the run log's, never the record's
        self.run_id = runlog.pipeline_run_id()
        self.git = runlog.git_state()
        self.mlflow_run_id: str | None = None
        self.parent_run_id: str | None = None  # the pipeline run's parent ("One parent run" above)
        self.stale_runs: list[str] = []  # runs of this stage a killed process had left RUNNING
        self.started, self._t0 = runlog.now_utc(), time.perf_counter()  # the stage's clock starts with its StageRun
        self._mlflow = None
        self._chain_tags: dict[str, str] = {}
        self._dag_records: dict[str, Any] | None = None
        self._renamed: dict[str, str] = {}  # MLflow name -> original, for names.json
        self._file_tags = {"input": 0, "output": 0}
        self.files: dict[str, dict[str, str]] = {"inputs": {}, "outputs": {}}  # path -> sha256, filled by the stage
        self.checkpoint_record: dict[str, Any] | None = None  # what the stage's checkpoints embed

    @property
    def seconds(self) -> float:

        return time.perf_counter() - self._t0

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Open the MLflow run (a :class:`BertraceError` when the store does not answer)."""
        if not self.enabled:
            return
        import mlflow

        experiment_id = setup_mlflow()
        try:
            self.stale_runs = close_stale_runs(mlflow.tracking.MlflowClient(), experiment_id, self.stage, self.run_id)
        except Exception as e:  # noqa: BLE001 - housekeeping must never stop the stage
            print(f"{self.stage}: could not check for stale MLflow runs ({type(e).__name__}: {e})", file=sys.stderr)
        if self.stale_runs:
            print(
                f"{self.stage}: marked {len(self.stale_runs)} MLflow run(s) left RUNNING by a killed earlier "
                f"attempt as KILLED: {', '.join(self.stale_runs[:5])}",
                file=sys.stderr,
            )
        tags = {
            "bertrace.stage": self.stage,
            "bertrace.pipeline_run_id": self.run_id,
            "bertrace.params_hash": prov.params_hash(self.params),
            "bertrace.git_dirty": str(self.git["dirty"]),
            PROCESS_TAG: process_id(),
        }
        if self.git["dirty"]:
            tags["bertrace.git_dirty_paths"] = ", ".join(self.git["dirty_paths"])[:500]
        exp = self.git.get("experiment") or {}
        if exp:  # dvc exp run: the experiment's name and the commit it started from
            tags.update({"bertrace.dvc_experiment": exp["name"], "bertrace.dvc_baseline_rev": exp["baseline_rev"]})
        self.parent_run_id = self._pipeline_parent(experiment_id, exp)
        if self.parent_run_id:
            tags.update({"mlflow.parentRunId": self.parent_run_id, KIND_TAG: "stage"})
        if self.git["commit"]:
            tags["mlflow.source.git.commit"] = self.git["commit"]
            tags["bertrace.git_commit"] = self.git["commit"]
        tags.update(system_tags())
        run = mlflow.start_run(
            experiment_id=experiment_id,
            run_name=mlflow_name(self.run_name),
            tags=mlflow_tags(tags, self._renamed),
            log_system_metrics=self.system_metrics or None,
        )
        self.mlflow_run_id = run.info.run_id
        self._mlflow = mlflow
        try:
            items = sorted(mlflow_params(self.params, self._renamed).items())
            for i in range(0, len(items), 100):  # MLflow takes at most 100 params per request
                mlflow.log_params(dict(items[i : i + 100]))
        except BaseException:  # end() will not run: close the run here, not leave it RUNNING
            mlflow.end_run(status="FAILED")
            if self.parent_run_id:
                mlflow.tracking.MlflowClient().set_terminated(self.parent_run_id, status="FAILED")
            raise
        if self.parent_run_id:
            try:
                client = mlflow.tracking.MlflowClient()
                log_stage_on_parent(client, self.parent_run_id, self.stage, params=self.params)
                link_reused(client, self.parent_run_id, experiment_id, self._upstream_records(), self.run_id)
            except Exception as e:  # noqa: BLE001 - the parent is a convenience, never stop the stage
                print(
                    f"{self.stage}: could not update the pipeline's parent MLflow run ({type(e).__name__}: {e})",
                    file=sys.stderr,
                )

    def _pipeline_parent(self, experiment_id: str, exp: dict[str, Any]) -> str | None:
        """The parent run of this pipeline run (:func:`pipeline_parent`), or None for a stage run on its own."""
        if not in_pipeline():
            return None
        import mlflow

        commit = (self.git.get("commit") or "")[:8]
        name = f"pipeline {exp['name']}" if exp else f"pipeline {commit or 'no-git'} {self.run_id[:8]}"
        tags = {
            "mlflow.source.git.commit": self.git.get("commit"),
            "bertrace.dvc_experiment": exp.get("name"),
            "bertrace.dvc_baseline_rev": exp.get("baseline_rev"),
        }
        try:
            return pipeline_parent(
                mlflow.tracking.MlflowClient(),
                experiment_id,
                self.run_id,
                run_name=name,
                tags={k: v for k, v in tags.items() if v},
            )
        except Exception as e:  # noqa: BLE001
            print(
                f"{self.stage}: no parent MLflow run for this pipeline run ({type(e).__name__}: {e})", file=sys.stderr
            )
            return None

    def _upstream_records(self) -> dict[str, Any]:
        """Provenance records of every stage upstream of this one in dvc.yaml (transitively), each
        with its run log's fields where this working copy has it (which run made it)."""
        records: dict[str, Any] = {}
        todo = list(self.dvc_lock or {})
        while todo:
            name = todo.pop()
            if name in records:
                continue
            try:
                records[name] = prov.read_record(name)
            except BertraceError:
                records[name] = None
            if records[name] is not None:
                records[name] = runlog.with_run(records[name], runlog.read_run_log(name, records[name]))
            todo += [n for n in (prov.dvc_lock_upstream(name) or {}) if n not in records]
        return {k: v for k, v in records.items() if v is not None}

    def end(self, exc_type: type | None, parent_metrics: dict[str, float] | None = None) -> None:
        """Close the run: FINISHED, FAILED (an exception) or KILLED (interrupted or terminated);
        ``parent_metrics`` go to the pipeline's parent run (None: the stage's DVC metrics files)."""
        if self._mlflow is None:
            return
        try:
            if exc_type is None:
                self._tag_child_runs()
            self._log_lists()
            self._mlflow.log_metrics({"stage_seconds": self.seconds, "peak_rss_mb": peak_rss_mb()})
        finally:
            interrupted = exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, SystemExit))
            status = "KILLED" if interrupted else "FAILED" if exc_type else "FINISHED"
            self._mlflow.end_run(status=status)
            if self.parent_run_id:  # the parent's end: its latest stage's
                try:
                    client = self._mlflow.tracking.MlflowClient()
                    if exc_type is None:
                        metrics = parent_metrics if parent_metrics is not None else stage_metrics(self.stage)
                        log_stage_on_parent(client, self.parent_run_id, self.stage, metrics=metrics)
                    client.set_terminated(self.parent_run_id, status=status)
                except Exception as e:  # noqa: BLE001
                    print(
                        f"{self.stage}: could not update the pipeline's parent MLflow run ({type(e).__name__}: {e})",
                        file=sys.stderr,
                    )

    # -- logging --------------------------------------------------------------------------
    def set_tags(self, tags: dict[str, Any]) -> None:
        if self._mlflow is not None:
            self._mlflow.set_tags(mlflow_tags(tags, self._renamed))

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """The numbers of a (nested) dict; names may hold any character (label names ...)."""
        if self._mlflow is not None:
            numeric = mlflow_metrics(metrics, self._renamed)
            if numeric:
                self._mlflow.log_metrics(numeric, step=step)

    def log_timings(self, timings: dict[str, Any]) -> None:
        """Durations and throughput: MLflow metrics and the run log's ``timings``."""
        self.timings.update(timings)
        self.log_metrics(timings)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:

        if self._mlflow is None or not Path(path).exists():
            return
        path = Path(path)
        folder = mlflow_artifact_path(artifact_path)
        name = mlflow_name(path.name)
        if name == path.name or path.is_dir():
            self._mlflow.log_artifact(str(path), artifact_path=folder)
            return
        self._renamed[name] = path.name
        with tempfile.TemporaryDirectory() as tmp:  # the file under a name the artifact store takes
            shutil.copyfile(path, Path(tmp) / name)
            self._mlflow.log_artifact(str(Path(tmp) / name), artifact_path=folder)

    def log_dict(self, obj: Any, name: str) -> None:
        """``obj`` as the JSON artifact ``name`` of the run."""
        if self._mlflow is not None:
            self._mlflow.log_text(
                json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n", mlflow_name(name)
            )

    def file_tag(self, kind: str, path: str | os.PathLike, digest: str, tag: bool) -> None:
        """``bertrace.<kind>.<file name>`` = sha256, for the first ``MAX_FILE_TAGS`` files of a kind."""
        if self._mlflow is None:
            return
        if tag and self._file_tags[kind] < MAX_FILE_TAGS:
            self._file_tags[kind] += 1
            self.set_tags({f"bertrace.{kind}.{Path(path).name}": digest})

    def _log_lists(self) -> None:
        """``files.json`` (every input and output, path → sha256) and ``names.json`` (MLflow names
        that differ from the original strings); best effort, as the run is being closed."""
        try:
            if self.files["inputs"] or self.files["outputs"]:
                self.log_dict(self.files, "files.json")
            self.set_tags(
                {
                    f"bertrace.{kind}s": f"{len(files)} files (path -> sha256: artifact files.json)"
                    for kind, files in (("input", self.files["inputs"]), ("output", self.files["outputs"]))
                    if len(files) > self._file_tags[kind]
                }
            )  # some files have no tag of their own
            if self._renamed:
                self.log_dict(dict(sorted(self._renamed.items())), "names.json")
        except Exception as e:  # noqa: BLE001
            print(
                f"{self.stage}: could not log files.json / names.json to MLflow ({type(e).__name__}: {e})",
                file=sys.stderr,
            )

    # -- the run log ----------------------------------------------------------------------
    def run_log(self, record: dict[str, Any]) -> dict[str, Any]:
        """When, where and by which runs ``record`` was made (:func:`pipeline.lineage.runlog.build_run_log`)."""
        return runlog.build_run_log(
            record,
            git=self.git,
            run_id=self.run_id,
            mlflow_run_id=self.mlflow_run_id,
            tracking=redacted_uri(tracking_uri()) if self._mlflow else None,
            started=self.started,
            seconds=self.seconds,
            timings=self.timings,
            checkpoint_record=self.checkpoint_record,
        )

    def checkpoint_written(self, record: dict[str, Any]) -> None:
        """The stage wrote checkpoints that embed ``record``: the run log and the MLflow tag
        ``bertrace.checkpoint_record_sha256`` name it, so ``bertrace trace`` of such a checkpoint
        finds this run (locally or on the tracking server)."""
        self.checkpoint_record = record
        self.set_tags({runlog.CHECKPOINT_RECORD_TAG: prov.record_digest(record)})

    def record_written(self, path: Path, record: dict[str, Any]) -> None:
        """After the stage wrote its record at ``path``: the run log (``runs/<stage>.json``), and in
        MLflow the artifacts ``provenance/<stage>.json`` (what ``bertrace trace <run id>`` reads) and
        ``provenance/run.json``; the run is tagged with the record's digest."""
        log = self.run_log(record)
        runlog.write_run_log(path.name, log)
        self.log_artifact(path, PROVENANCE_ARTIFACT_DIR)
        if self._mlflow is not None:
            self._mlflow.log_text(
                json.dumps(log, indent=2, sort_keys=True) + "\n", f"{PROVENANCE_ARTIFACT_DIR}/run.json"
            )
        self.set_tags(
            {
                "bertrace.provenance_artifact": f"{PROVENANCE_ARTIFACT_DIR}/{path.name}",
                runlog.RECORD_TAG: log["record_sha256"],
            }
        )
        self.update_chain_tags(record)

    # -- chain ids on MLflow runs ---------------------------------------------------------
    def chain_tags(self, record: dict[str, Any]) -> dict[str, str]:
        """``bertrace.chain.<id>`` tags for this run: the hashes of the tokenizer, examples,
        checkpoints … it descends from (or produced); the records of its DVC upstream stages
        fill in what the stage's own record does not embed."""
        if self._dag_records is None:  # the records of the stages dvc.yaml puts upstream (e.g. for validate)
            self._dag_records = {}
            for name in self.dvc_lock or {}:
                try:
                    if (rec := prov.read_record(name)) is not None:
                        self._dag_records[name] = rec
                except BertraceError:  # an unreadable record: the stage reports it if it reads it
                    pass
        missing = {n: r for n, r in self._dag_records.items() if n not in (record.get("upstream") or {})}
        if missing:
            record = {**record, "upstream": {**(record.get("upstream") or {}), **missing}}
        return {prov.CHAIN_TAG_PREFIX + k: v for k, v in prov.chain_ids(record).items()}

    def update_chain_tags(self, record: dict[str, Any]) -> None:
        if self._mlflow is None:
            return
        tags = self.chain_tags(record)
        new = {k: v for k, v in tags.items() if self._chain_tags.get(k) != v}
        if new:
            self.set_tags(new)
            self._chain_tags.update(new)

    def _tag_child_runs(self) -> None:
        """Give nested runs (e.g. one per fine-tuning seed) the parent's chain and git tags."""
        if not self._chain_tags or self.mlflow_run_id is None:
            return
        client = self._mlflow.tracking.MlflowClient()
        run = client.get_run(self.mlflow_run_id)
        children = client.search_runs(
            [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{self.mlflow_run_id}'"
        )
        inherited = {k: v for k, v in run.data.tags.items() if k.startswith(CHILD_TAGS)}
        for child in children:
            for key, value in {**inherited, **self._chain_tags}.items():
                if child.data.tags.get(key) != value:
                    client.set_tag(child.info.run_id, key, value)


def _source_name() -> str:
    """The entry point, relative to the working copy (``stages/evaluate.py``): MLflow's default
    ``mlflow.source.name`` is the absolute path, which names the machine's checkout, not the code."""
    main = Path(sys.argv[0] or "<stdin>")
    try:
        return main.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return main.name


def _repo_url_tags() -> dict[str, str]:
    """MLflow's ``mlflow.source.git.repoURL`` / ``mlflow.gitRepoURL`` (the ``origin`` remote) as a
    teammate can use it: a clone of a local directory says so instead of naming this machine's path,
    and the user and password of an ``https://user:token@host/...`` remote are dropped."""
    return dict(_repo_url_tags_of(str(Path.cwd().resolve())))


@functools.cache
def _repo_url_tags_of(checkout: str) -> tuple[tuple[str, str], ...]:
    """:func:`_repo_url_tags` of ``checkout``, asked of git once per process (every fine-tuning
    seed's nested run sets them)."""
    import subprocess
    from urllib.parse import urlsplit, urlunsplit

    try:
        url = subprocess.run(
            ["git", "remote", "get-url", "origin"], capture_output=True, text=True, timeout=10, cwd=checkout
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ()
    if not url:
        return ()
    parts = urlsplit(url)
    if parts.scheme in ("", "file") and not re.match(r"^[\w.-]+@[\w.-]+:", url):  # a path, not user@host:repo
        url = "(a local directory)"
    elif parts.password or parts.username:
        url = urlunsplit(
            (
                parts.scheme,
                parts.hostname + (f":{parts.port}" if parts.port else ""),
                parts.path,
                parts.query,
                parts.fragment,
            )
        )
    return (("mlflow.source.git.repoURL", url), ("mlflow.gitRepoURL", url))


def source_tags() -> dict[str, str]:
    """MLflow's source tags without this machine's paths: every run a stage starts sets them
    (MLflow's defaults name the checkout's absolute path and the origin remote as it is)."""
    return {"mlflow.source.name": _source_name(), **_repo_url_tags()}


def system_tags() -> dict[str, str]:
    """Where the stage ran: host, CPUs, Python, torch and accelerator (when torch is loaded)."""
    import platform

    tags = {
        "bertrace.host": platform.node(),
        "bertrace.cpus": str(os.cpu_count()),
        "bertrace.python": platform.python_version(),
        "bertrace.platform": platform.platform(),
        **source_tags(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        tags["bertrace.torch"] = torch.__version__
        tags["bertrace.torch_threads"] = str(torch.get_num_threads())
        if torch.cuda.is_available():
            tags["bertrace.cuda_device"] = torch.cuda.get_device_name(0)
            tags["bertrace.cuda_devices"] = str(torch.cuda.device_count())
    return tags
