"""What every stage does around its library call: params, provenance, MLflow, errors."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import yaml

from pipeline.core.errors import BertraceError
from pipeline.core.io import write_json
from pipeline.lineage import provenance as prov
from pipeline.lineage import restore, tracking

PARAMS_FILE = "params.yaml"
PROVENANCE_DIR = prov.PROVENANCE_DIR
METRICS_DIR = Path("metrics")
DETAILS_DIR = Path("reports")  # reports/<stage>.json: all of a stage's numbers (metrics/: the few compared)


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
    return prov.read_record(stage)


class StageRun:
    """Context manager around one stage execution: what it records, and where it reports.

    The stage hands it the files it read and wrote (:meth:`add_input`, :meth:`add_output`, hashed
    for the provenance record), the upstream records it builds on and its params; it writes the
    record (``data/provenance/<stage>.json``), the stage's metrics and details files — DVC outputs, a
    function of code, params and data only. Everything about the run itself (MLflow run, tags,
    timings, the run log ``runs/<stage>.json``) goes through :class:`pipeline.lineage.tracking.StageLog`,
    which no stage's output depends on (the README's rule on code deps)."""

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
        self.upstream: dict[str, Any] = {}
        self._fields: dict[str, Any] = {}  # the record's fields beyond code, params and files (add_fields)
        self.dvc_lock = prov.dvc_lock_upstream(stage)  # before DVC rewrites this stage's own entry
        self.log = tracking.StageLog(
            stage,
            params,
            dvc_lock=self.dvc_lock,
            enabled=log_mlflow,
            run_name=run_name,
            system_metrics=system_metrics,
        )
        self.inputs: dict[str, str] = self.log.files["inputs"]
        self.outputs: dict[str, str] = self.log.files["outputs"]
        self.parent_metrics: dict[str, float] | None = None  # for the parent run; None: the stage's metrics file

    def __enter__(self) -> "StageRun":
        try:
            self.log.start()
        except BertraceError as e:
            raise BertraceError(f"{e}{restore.restore_hint(os.environ.get('DVC_STAGE'))}") from None
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.log.end(exc_type, self.parent_metrics)

    # what the run log knows: ids, git state, the clock
    @property
    def run_id(self) -> str:
        return self.log.run_id

    @property
    def mlflow_run_id(self) -> str | None:
        return self.log.mlflow_run_id

    @property
    def seconds(self) -> float:
        return self.log.seconds

    # -- recording ------------------------------------------------------------------------
    def add_input(self, path: str | os.PathLike, sha256: str | None = None, *, tag: bool = True) -> str:
        """Record an input (hashed unless ``sha256`` is given); ``tag``: also as a
        ``bertrace.input.<file name>`` MLflow tag (a corpus of many files passes False: its list
        is the ``files.json`` artifact)."""
        if sha256 is None and not Path(path).exists():
            raise BertraceError(
                f"{path}: input of stage '{self.stage}' not found; run `dvc repro {self.stage}` "
                "(it builds the upstream stages first) or the stage that writes it"
            )
        digest = sha256 or prov.hash_path(path)
        self.inputs[Path(path).as_posix()] = digest
        self.log.file_tag("input", path, digest, tag)
        self.log.update_chain_tags(self._partial_record())
        return digest

    def add_output(self, path: str | os.PathLike, sha256: str | None = None, *, tag: bool = True) -> str:
        digest = sha256 or prov.hash_path(path)
        self.outputs[Path(path).as_posix()] = digest
        self.log.file_tag("output", path, digest, tag)
        self.log.update_chain_tags(self._partial_record())
        return digest

    def add_upstream(self, stage: str, record: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Embed ``stage``'s record (data/provenance/) in this one, without its code identity
        (:func:`pipeline.lineage.provenance.without_code`): that stays in the upstream record, so an
        upstream edit that changes no output changes no downstream record. ``record``: embed this one
        as it is instead (a checkpoint's own chain, e.g. one imported from Hugging Face)."""
        if record is not None:
            self.upstream[stage] = record
            self.log.update_chain_tags(self._partial_record())
            return record
        record = upstream_record(stage)
        if record is not None:
            self.upstream[stage] = prov.without_code(record)
            self.log.update_chain_tags(self._partial_record())
        return record

    def add_fields(self, fields: dict[str, Any]) -> None:
        """Add fields to the stage's record (``data/provenance/<stage>.json``, a DVC output: values
        that follow from code, params and data only; run facts go to :meth:`set_tags`)."""
        self._fields.update(fields)
        self.log.update_chain_tags(self._partial_record())

    def _partial_record(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "upstream": self.upstream,
            **self._fields,
        }

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
            extra=self._fields or None,
        )

    def checkpoint_provenance(self, without: tuple[str, ...] = (), **fields: Any) -> dict[str, Any]:
        """The record as a checkpoint embeds it: without the code identity of this or any upstream
        stage (:func:`pipeline.lineage.provenance.without_code`), so the checkpoint's bytes change only
        when its data, params or libraries do; ``data/provenance/<stage>.json`` keeps the code hashes.
        ``without``: keys to leave out; ``fields``: keys to add (the fine-tuned checkpoint's own)."""
        record = {k: v for k, v in prov.without_code(self.provenance()).items() if k not in without}
        return {**record, **fields}

    # -- reporting (MLflow and the run log; never a DVC output) --------------------------
    def set_tags(self, tags: dict[str, Any]) -> None:
        self.log.set_tags(tags)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self.log.log_metrics(metrics, step=step)

    def log_timings(self, timings: dict[str, Any]) -> None:
        """Durations and throughput (``seconds``, ``examples_per_s`` …): MLflow metrics and the run
        log, never a DVC output (they differ on every rebuild)."""
        self.log.log_timings(timings)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        self.log.log_artifact(path, artifact_path)

    def checkpoint_written(self, provenance: dict[str, Any]) -> None:
        """The stage wrote checkpoints embedding ``provenance``: its run log names them (call it
        before :meth:`write_provenance`)."""
        self.log.checkpoint_written(provenance)

    def log_dict(self, obj: Any, name: str) -> None:
        self.log.log_dict(obj, name)

    # -- outputs --------------------------------------------------------------------------
    def write_provenance(self, path: str | os.PathLike | None = None) -> Path:
        """Write the record (``data/provenance/<stage>.json``); the run log and MLflow get it too
        (:meth:`pipeline.lineage.tracking.StageLog.record_written`)."""
        path = Path(path) if path else PROVENANCE_DIR / f"{self.stage}.json"
        record = self.provenance()
        write_json(path, record)
        self.log.record_written(path, record)
        return path

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
        """Every number the stage measured, as ``reports/<stage>.json`` (a DVC-cached output, not
        a metrics file), logged to MLflow too."""
        path = Path(path) if path else DETAILS_DIR / f"{self.stage}.json"
        write_json(path, details)
        self.log_metrics(details)
        return path


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
