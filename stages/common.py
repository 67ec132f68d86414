"""What every stage does around its library call: params, provenance, MLflow, errors."""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import yaml

from pipeline.core.errors import BertraceError
from pipeline.core.io import read_json, write_json
from pipeline.lineage import provenance as prov
from pipeline.lineage import tracking

PARAMS_FILE = "params.yaml"
PROVENANCE_DIR = Path("data/provenance")
METRICS_DIR = Path("metrics")
DETAILS_DIR = Path("reports")  # reports/<stage>.json: all of a stage's numbers (metrics/: the few compared)
PROVENANCE_ARTIFACT_DIR = "provenance"  # MLflow artifact folder of the provenance record
CHILD_TAGS = ("bertrace.git_", "bertrace.params_hash", "bertrace.pipeline_run_id", prov.CHAIN_TAG_PREFIX)
MAX_FILE_TAGS = 16  # per-file bertrace.input.* / bertrace.output.* tags per run; all files: the files.json artifact


def load_params(section: str, params_file: str | os.PathLike = PARAMS_FILE) -> dict[str, Any]:
    """The ``section`` of params.yaml as a dict, with a clear error when it's missing."""
    path = Path(params_file)
    if not path.exists():
        raise BertraceError(f"{path}: not found; run stages from the repository root (where params.yaml is)")
    try:
        params = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise BertraceError(f"{path}: not valid YAML: {e}") from None
    if section not in params:
        raise BertraceError(f"{path}: has no '{section}:' section; restore it from the repository's params.yaml")
    return params[section]


def upstream_record(stage: str) -> dict[str, Any] | None:
    """The provenance record an upstream stage left in data/provenance/, if present."""
    path = PROVENANCE_DIR / f"{stage}.json"
    return read_json(path) if path.exists() else None


def peak_rss_mb() -> float:
    """Peak resident memory of this process and its finished children, in MiB (Linux: KiB units)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024.0


class StageRun:
    """Context manager around one stage execution.

    Opens an MLflow run tagged with the stage, git commit, dirty flag, params hash and the
    pipeline-run id shared by all stages of one ``dvc repro``; collects input/output hashes
    for the provenance record (and the upstream stages' ``dvc.lock`` entries as they are when
    the stage starts); keeps the ``bertrace.chain.*`` tags (tokenizer, examples, checkpoint
    hashes, see :func:`pipeline.lineage.provenance.chain_ids`) current on the run and its child runs;
    on exit logs wall time and peak memory and closes the run (FAILED when an exception escapes,
    KILLED when interrupted or terminated).

    Every name that reaches MLflow (param, tag and metric keys, artifact folders) goes through
    :func:`pipeline.lineage.tracking.mlflow_name`; renamed ones are listed with their originals in the
    ``names.json`` artifact, and every input and output file (path → sha256) in ``files.json``
    (per-file tags only for the first ``MAX_FILE_TAGS`` files). On start, runs of this stage that
    a killed process left ``RUNNING`` are marked ``KILLED`` (:func:`pipeline.lineage.tracking.close_stale_runs`).

    Under DVC the run is nested in its pipeline run's parent run (:func:`pipeline.lineage.tracking.pipeline_parent`),
    which gets the stage's params and metrics and links the upstream stages DVC did not rerun
    (``bertrace.reused.<stage>``).
    """

    def __init__(
        self,
        stage: str,
        params: dict[str, Any],
        *,
        log_mlflow: bool = True,
        run_name: str | None = None,
        system_metrics: bool = False,
    ):
        self.stage = stage
        self.params = params
        self.log_mlflow = log_mlflow and os.environ.get("BERTRACE_NO_MLFLOW") != "1"
        self.run_name = run_name or stage
        self.system_metrics = system_metrics  # MLflow's sampler: CPU, memory, GPU every 10 s
        self.inputs: dict[str, str] = {}
        self.outputs: dict[str, str] = {}
        self.upstream: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
        self.timings: dict[str, Any] = {}  # durations and throughput: the run log's, never the record's
        self.run_id = prov.pipeline_run_id()
        self.git = prov.git_state()
        self.dvc_lock = prov.dvc_lock_upstream(stage)  # before DVC rewrites this stage's own entry
        self.mlflow_run_id: str | None = None
        self.parent_run_id: str | None = None  # the pipeline run's parent (pipeline.lineage.tracking, "One parent run")
        self._mlflow = None
        self._chain_tags: dict[str, str] = {}
        self._dag_records: dict[str, Any] | None = None
        self._renamed: dict[str, str] = {}  # MLflow name -> original, for names.json
        self._file_tags = {"input": 0, "output": 0}
        self.stale_runs: list[str] = []  # runs of this stage a killed process had left RUNNING
        self.parent_metrics: dict[str, float] | None = None  # for the parent run; None: the stage's metrics file

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> "StageRun":
        self._t0 = time.perf_counter()
        self.started = prov.now_utc()
        if self.log_mlflow:
            import mlflow

            try:
                experiment_id = tracking.setup_mlflow()
            except BertraceError as e:
                raise BertraceError(f"{e}{_restore_hint(self.stage)}") from None
            try:
                self.stale_runs = tracking.close_stale_runs(
                    mlflow.tracking.MlflowClient(), experiment_id, self.stage, self.run_id
                )
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
                tracking.PROCESS_TAG: tracking.process_id(),
            }
            if self.git["dirty"]:
                tags["bertrace.git_dirty_paths"] = ", ".join(self.git["dirty_paths"])[:500]
            exp = self.git.get("experiment") or {}
            if exp:  # dvc exp run: the experiment's name and the commit it started from
                tags.update({"bertrace.dvc_experiment": exp["name"], "bertrace.dvc_baseline_rev": exp["baseline_rev"]})
            self.parent_run_id = self._pipeline_parent(experiment_id, exp)
            if self.parent_run_id:
                tags.update({"mlflow.parentRunId": self.parent_run_id, tracking.KIND_TAG: "stage"})
            if self.git["commit"]:
                tags["mlflow.source.git.commit"] = self.git["commit"]
                tags["bertrace.git_commit"] = self.git["commit"]
            tags.update(_system_tags())
            run = mlflow.start_run(
                experiment_id=experiment_id,
                run_name=tracking.mlflow_name(self.run_name),
                tags=tracking.mlflow_tags(tags, self._renamed),
                log_system_metrics=self.system_metrics or None,
            )
            self.mlflow_run_id = run.info.run_id
            self._mlflow = mlflow
            try:
                params = tracking.mlflow_params(self.params, self._renamed)
                items = sorted(params.items())
                for i in range(0, len(items), 100):  # MLflow takes at most 100 params per request
                    mlflow.log_params(dict(items[i : i + 100]))
            except BaseException:  # __exit__ will not run: close the run here, not leave it RUNNING
                mlflow.end_run(status="FAILED")
                if self.parent_run_id:
                    mlflow.tracking.MlflowClient().set_terminated(self.parent_run_id, status="FAILED")
                raise
            if self.parent_run_id:
                try:
                    client = mlflow.tracking.MlflowClient()
                    tracking.log_stage_on_parent(client, self.parent_run_id, self.stage, params=self.params)
                    tracking.link_reused(
                        client, self.parent_run_id, experiment_id, self._upstream_records(), self.run_id
                    )
                except Exception as e:  # noqa: BLE001 - the parent is a convenience, never stop the stage
                    print(
                        f"{self.stage}: could not update the pipeline's parent MLflow run ({type(e).__name__}: {e})",
                        file=sys.stderr,
                    )
        return self

    def _pipeline_parent(self, experiment_id: str, exp: dict[str, Any]) -> str | None:
        """The parent run of this pipeline run (:func:`pipeline.lineage.tracking.pipeline_parent`), or None
        for a stage run on its own."""
        if not tracking.in_pipeline():
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
            return tracking.pipeline_parent(
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
        """Provenance records of every stage upstream of this one in dvc.yaml (transitively)."""
        records: dict[str, Any] = {}
        todo = list(self.dvc_lock or {})
        while todo:
            name = todo.pop()
            if name in records:
                continue
            try:
                records[name] = upstream_record(name)
            except BertraceError:
                records[name] = None
            if records[name] is not None:  # which run made it: this working copy's run log, if it has one
                records[name] = prov.with_run(records[name], prov.read_run_log(name, records[name]))
            todo += [n for n in (prov.dvc_lock_upstream(name) or {}) if n not in records]
        return {k: v for k, v in records.items() if v is not None}

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._mlflow is not None:
            try:
                if exc_type is None:
                    self._tag_child_runs()
                self._log_lists()
                self._mlflow.log_metrics(
                    {"stage_seconds": time.perf_counter() - self._t0, "peak_rss_mb": peak_rss_mb()}
                )
            finally:
                interrupted = exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, SystemExit))
                status = "KILLED" if interrupted else "FAILED" if exc_type else "FINISHED"
                self._mlflow.end_run(status=status)
                if self.parent_run_id:  # the parent's end: its latest stage's
                    try:
                        client = self._mlflow.tracking.MlflowClient()
                        if exc_type is None:
                            metrics = self.parent_metrics
                            if metrics is None:
                                metrics = tracking.stage_metrics(self.stage)
                            tracking.log_stage_on_parent(client, self.parent_run_id, self.stage, metrics=metrics)
                        client.set_terminated(self.parent_run_id, status=status)
                    except Exception as e:  # noqa: BLE001
                        print(
                            f"{self.stage}: could not update the pipeline's parent MLflow run "
                            f"({type(e).__name__}: {e})",
                            file=sys.stderr,
                        )

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self._t0

    # -- recording ------------------------------------------------------------------------
    def add_input(self, path: str | os.PathLike, sha256: str | None = None, *, tag: bool = True) -> str:
        """Record an input (hashed unless ``sha256`` is given); ``tag``: also as a
        ``bertrace.input.<file name>`` tag (for the first ``MAX_FILE_TAGS`` files; a corpus of
        many files passes False: its list is the ``files.json`` artifact)."""
        if sha256 is None and not Path(path).exists():
            raise BertraceError(
                f"{path}: input of stage '{self.stage}' not found; run `dvc repro {self.stage}` "
                "(it builds the upstream stages first) or the stage that writes it"
            )
        digest = sha256 or prov.hash_path(path)
        self.inputs[Path(path).as_posix()] = digest
        self._file_tag("input", path, digest, tag)
        self._update_chain_tags()
        return digest

    def add_output(self, path: str | os.PathLike, sha256: str | None = None, *, tag: bool = True) -> str:
        digest = sha256 or prov.hash_path(path)
        self.outputs[Path(path).as_posix()] = digest
        self._file_tag("output", path, digest, tag)
        self._update_chain_tags()
        return digest

    def _file_tag(self, kind: str, path: str | os.PathLike, digest: str, tag: bool) -> None:
        if self._mlflow is None:
            return
        if tag and self._file_tags[kind] < MAX_FILE_TAGS:
            self._file_tags[kind] += 1
            self.set_tags({f"bertrace.{kind}.{Path(path).name}": digest})

    def add_upstream(self, stage: str) -> dict[str, Any] | None:
        record = upstream_record(stage)
        if record is not None:
            self.upstream[stage] = record
            self._update_chain_tags()
        return record

    def set_tags(self, tags: dict[str, Any]) -> None:
        if self._mlflow is not None:
            self._mlflow.set_tags(tracking.mlflow_tags(tags, self._renamed))

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """The numbers of a (nested) dict; names may hold any character (label names ...)."""
        if self._mlflow is not None:
            numeric = tracking.mlflow_metrics(metrics, self._renamed)
            if numeric:
                self._mlflow.log_metrics(numeric, step=step)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        if self._mlflow is None or not Path(path).exists():
            return
        path = Path(path)
        folder = tracking.mlflow_artifact_path(artifact_path)
        name = tracking.mlflow_name(path.name)
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
                json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n",
                tracking.mlflow_name(name),
            )

    def _log_lists(self) -> None:
        """``files.json`` (every input and output, path → sha256) and ``names.json`` (MLflow names
        that differ from the original strings); best effort, as the run is being closed."""
        try:
            if self.inputs or self.outputs:
                self.log_dict({"inputs": self.inputs, "outputs": self.outputs}, "files.json")
            self.set_tags(
                {
                    f"bertrace.{kind}s": f"{len(files)} files (path -> sha256: artifact files.json)"
                    for kind, files in (("input", self.inputs), ("output", self.outputs))
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

    def provenance(self) -> dict[str, Any]:
        """The stage's record: code, params and input/output hashes only (:func:`pipeline.lineage.provenance.build_record`)."""
        return prov.build_record(
            self.stage,
            self.params,
            inputs=self.inputs,
            outputs=self.outputs,
            upstream=self.upstream,
            dvc_lock=self.dvc_lock,
            code=prov.code_hashes(self.stage),
            extra=self.extra or None,
        )

    def checkpoint_provenance(self) -> dict[str, Any]:
        """The record with this run's fields (git, run ids, start time) laid over it, for a checkpoint
        to carry: a checkpoint file holds timings anyway, and stays traceable on its own."""
        record = self.provenance()
        return prov.with_run(record, self.run_log(record))

    def run_log(self, record: dict[str, Any]) -> dict[str, Any]:
        """When, where and by which runs ``record`` was made (:func:`pipeline.lineage.provenance.build_run_log`)."""
        return prov.build_run_log(
            record,
            git=self.git,
            run_id=self.run_id,
            mlflow_run_id=self.mlflow_run_id,
            tracking=tracking.redacted_uri(tracking.tracking_uri()) if self._mlflow else None,
            started=self.started,
            seconds=self.seconds,
            timings=self.timings,
        )

    def log_timings(self, timings: dict[str, Any]) -> None:
        """Durations and throughput (``seconds``, ``examples_per_s`` …): MLflow metrics and the run
        log, never a DVC output (they differ on every rebuild)."""
        self.timings.update(timings)
        self.log_metrics(timings)

    def write_provenance(self, path: str | os.PathLike | None = None) -> Path:
        """Write the record (``data/provenance/<stage>.json``) and the run log (``runs/<stage>.json``),
        and log both to MLflow as the artifacts ``provenance/<stage>.json`` (what ``bertrace trace
        <run id>`` reads) and ``provenance/run.json``; the run is tagged with the record's digest."""
        path = Path(path) if path else PROVENANCE_DIR / f"{self.stage}.json"
        record = self.provenance()
        write_json(path, record)
        log = self.run_log(record)
        log_path = prov.RUN_LOG_DIR / path.name
        write_json(log_path, log)
        self.log_artifact(path, PROVENANCE_ARTIFACT_DIR)
        if self._mlflow is not None:
            self._mlflow.log_text(
                json.dumps(log, indent=2, sort_keys=True) + "\n", f"{PROVENANCE_ARTIFACT_DIR}/run.json"
            )
        self.set_tags(
            {
                "bertrace.provenance_artifact": f"{PROVENANCE_ARTIFACT_DIR}/{path.name}",
                prov.RECORD_TAG: log["record_sha256"],
            }
        )
        self._update_chain_tags(record)
        return path

    # -- chain ids on MLflow runs ---------------------------------------------------------
    def chain_tags(self, record: dict[str, Any] | None = None) -> dict[str, str]:
        """``bertrace.chain.<id>`` tags for this run: the hashes of the tokenizer, examples,
        checkpoints … it descends from (or produced); the records of its DVC upstream stages
        fill in what the stage's own record does not embed."""
        if record is None:
            record = {
                "stage": self.stage,
                "inputs": self.inputs,
                "outputs": self.outputs,
                "upstream": self.upstream,
                **self.extra,
            }
        if self._dag_records is None:  # the records of the stages dvc.yaml puts upstream (e.g. for validate)
            self._dag_records = {}
            for name in self.dvc_lock or {}:
                try:
                    if (rec := upstream_record(name)) is not None:
                        self._dag_records[name] = rec
                except BertraceError:  # an unreadable record: the stage reports it if it reads it
                    pass
        missing = {n: r for n, r in self._dag_records.items() if n not in (record.get("upstream") or {})}
        if missing:
            record = {**record, "upstream": {**(record.get("upstream") or {}), **missing}}
        return {prov.CHAIN_TAG_PREFIX + k: v for k, v in prov.chain_ids(record).items()}

    def _update_chain_tags(self, record: dict[str, Any] | None = None) -> None:
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

    def write_metrics(
        self, metrics: dict[str, Any], path: str | os.PathLike | None = None, *, details: dict[str, Any] | None = None
    ) -> Path:
        """Write the stage's DVC metrics file (``metrics/<stage>.json``) and log the numbers to MLflow.

        The metrics file holds only the few numbers a user compares across runs: ``dvc metrics
        show`` and ``dvc exp show`` put every key of every metrics file in one table, which must
        fit a 160-column terminal (tests/e2e/test_daily_loop.py), and a key that two metrics files share
        becomes ``<path>:<key>`` there, so keys are unique across files. ``details`` (all the numbers: per
        seed, per class, per expectation …) go to ``reports/<stage>.json`` (:meth:`write_details`)."""
        path = Path(path) if path else METRICS_DIR / f"{self.stage}.json"
        if details is not None:
            self.write_details(details)
        write_json(path, metrics)
        self.log_metrics(metrics)
        return path

    def write_details(self, details: dict[str, Any], path: str | os.PathLike | None = None) -> Path:
        """Every number the stage measured, as ``reports/<stage>.json`` (a plain DVC output, not
        a metrics file), logged to MLflow too."""
        path = Path(path) if path else DETAILS_DIR / f"{self.stage}.json"
        write_json(path, details)
        self.log_metrics(details)
        return path


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


def _restore_hint(stage: str) -> str:
    """Under ``dvc repro``: how to get back the outputs DVC removed before starting the stage
    (cached ones from the DVC cache, ``cache: false`` ones from git). Empty outside DVC."""
    name = os.environ.get("DVC_STAGE")
    spec = prov.dvc_stages(".").get(name or "") if name else None
    if not spec:
        return ""
    outs = [*(spec.get("outs") or []), *(spec.get("metrics") or []), *(spec.get("plots") or [])]
    unversioned = prov.uncached_paths(outs)
    uncached = [path for path in prov.dvc_paths(outs) if path in unversioned]
    hint = f"; DVC removed {name}'s outputs before it ran: `dvc checkout {name}` puts them back"
    if uncached:
        hint += f" (`git checkout -- {' '.join(uncached)}` the uncached ones)"
    return hint + " (`make repro` checks the store before DVC touches anything)"


def source_tags() -> dict[str, str]:
    """MLflow's source tags without this machine's paths: every run a stage starts sets them
    (MLflow's defaults name the checkout's absolute path and the origin remote as it is)."""
    return {"mlflow.source.name": _source_name(), **_repo_url_tags()}


def _system_tags() -> dict[str, str]:
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


def run_stage(main: Callable[[], Any]) -> None:
    """Run a stage's ``main``; user errors print one line and exit 2, no traceback.

    A full disk (``ENOSPC``, or torch's ``inline_container`` write failure) is a user error too:
    it names the path and the free space. SIGTERM (``kill``, a scheduler's timeout) ends the
    stage like Ctrl-C, so its MLflow run is closed as KILLED."""
    global _MAIN_PID
    _MAIN_PID = os.getpid()
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _terminate)
    try:
        main()
    except BertraceError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            _unexpected()
        print(f"error: {disk_full_message(e.filename, e)}", file=sys.stderr)
        sys.exit(2)
    except Exception as e:
        if is_disk_full(e):
            print(f"error: {disk_full_message(None, e)}", file=sys.stderr)
            sys.exit(2)
        _unexpected()


_MAIN_PID = -1


def _terminate(signum, frame):  # noqa: ARG001
    if os.getpid() != _MAIN_PID:  # a forked worker: die as it would have without the handler
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt


def _unexpected() -> None:
    traceback.print_exc()
    print("error: unexpected failure (a bug in bertrace, please report it with the traceback above)", file=sys.stderr)
    sys.exit(1)


def is_disk_full(e: BaseException) -> bool:
    """ENOSPC / EDQUOT, or torch's zip writer failing the way it does on a full disk."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("inline_container" in text or "PytorchStreamWriter failed" in text)


def disk_full_message(path: str | os.PathLike | None, e: BaseException) -> str:
    """One line: the path being written, the free space there, what to do."""
    where = Path(path) if path else Path.cwd()
    probe = where if where.is_dir() else where.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = f"{shutil.disk_usage(probe).free / 2**20:,.0f} MiB free there"
    except OSError:
        free = "free space unknown"
    return (
        f"{where}: no space left on the device while writing ({type(e).__name__}: {str(e).strip()[:120]}; "
        f"{free}); free some space (or point the output elsewhere) and rerun the stage"
    )
