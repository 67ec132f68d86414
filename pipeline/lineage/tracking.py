"""One stage's MLflow run and run log (:class:`StageLog`), and the source and system tags of its runs.

Where runs go is :mod:`pipeline.lineage.mlflow_store`, how names reach MLflow
:mod:`pipeline.lineage.mlflow_names`, stale and parent runs :mod:`pipeline.lineage.mlflow_runs`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.core.errors import BertraceError
from pipeline.lineage import provenance as prov
from pipeline.lineage import runlog
from pipeline.lineage.mlflow_names import mlflow_artifact_path, mlflow_metrics, mlflow_name, mlflow_params, mlflow_tags
from pipeline.lineage.mlflow_runs import (
    KIND_TAG,
    PROCESS_TAG,
    close_stale_runs,
    in_pipeline,
    link_reused,
    log_stage_on_parent,
    pipeline_parent,
    process_id,
    stage_metrics,
)
from pipeline.lineage.mlflow_store import redacted_uri, setup_mlflow, tracking_uri

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
        self.parent_run_id: str | None = None  # the pipeline run's parent (mlflow_runs, "One parent run")
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
