"""MLflow runs beyond one stage's own: runs a killed stage left ``RUNNING``, the parent run of a
pipeline run, and the runs that made the outputs of stages DVC did not rerun."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from pipeline.lineage import provenance as prov
from pipeline.lineage import runlog
from pipeline.lineage.mlflow_names import mlflow_metrics, mlflow_name, mlflow_params, mlflow_tags

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
