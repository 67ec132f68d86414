"""What every stage does around its library call: params, provenance, MLflow, errors."""

from __future__ import annotations

import datetime as _dt
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import yaml

from pipeline.errors import BertraceError
from pipeline.io import read_json, write_json
from pipeline import provenance as prov
from pipeline import tracking

PARAMS_FILE = "params.yaml"
PROVENANCE_DIR = Path("data/provenance")
METRICS_DIR = Path("metrics")


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
    for the provenance record; on exit logs wall time and peak memory and closes the run
    (FAILED when an exception escapes).
    """

    def __init__(self, stage: str, params: dict[str, Any], *, log_mlflow: bool = True, run_name: str | None = None,
                 system_metrics: bool = False):
        self.stage = stage
        self.params = params
        self.log_mlflow = log_mlflow and os.environ.get("BERTRACE_NO_MLFLOW") != "1"
        self.run_name = run_name or stage
        self.system_metrics = system_metrics  # MLflow's sampler: CPU, memory, GPU every 10 s
        self.inputs: dict[str, str] = {}
        self.outputs: dict[str, str] = {}
        self.upstream: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
        self.run_id = prov.pipeline_run_id()
        self.git = prov.git_state()
        self.mlflow_run_id: str | None = None
        self._mlflow = None

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> "StageRun":
        self._t0 = time.perf_counter()
        self.started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        if self.log_mlflow:
            import mlflow

            experiment_id = tracking.setup_mlflow()
            tags = {
                "bertrace.stage": self.stage,
                "bertrace.pipeline_run_id": self.run_id,
                "bertrace.params_hash": prov.params_hash(self.params),
                "bertrace.git_dirty": str(self.git["dirty"]),
            }
            if self.git["commit"]:
                tags["mlflow.source.git.commit"] = self.git["commit"]
                tags["bertrace.git_commit"] = self.git["commit"]
            tags.update(_system_tags())
            run = mlflow.start_run(experiment_id=experiment_id, run_name=self.run_name, tags=tags,
                                   log_system_metrics=self.system_metrics or None)
            self.mlflow_run_id = run.info.run_id
            mlflow.log_params(tracking.mlflow_params(self.params))
            self._mlflow = mlflow
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._mlflow is not None:
            try:
                self._mlflow.log_metrics(
                    {"stage_seconds": time.perf_counter() - self._t0, "peak_rss_mb": peak_rss_mb()}
                )
            finally:
                self._mlflow.end_run(status="FAILED" if exc_type else "FINISHED")

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self._t0

    # -- recording ------------------------------------------------------------------------
    def add_input(self, path: str | os.PathLike, sha256: str | None = None) -> str:
        if sha256 is None and not Path(path).exists():
            raise BertraceError(
                f"{path}: input of stage '{self.stage}' not found; run `dvc repro {self.stage}` "
                "(it builds the upstream stages first) or the stage that writes it"
            )
        digest = sha256 or prov.hash_path(path)
        self.inputs[Path(path).as_posix()] = digest
        self.set_tags({f"bertrace.input.{Path(path).name}": digest})
        return digest

    def add_output(self, path: str | os.PathLike, sha256: str | None = None) -> str:
        digest = sha256 or prov.hash_path(path)
        self.outputs[Path(path).as_posix()] = digest
        self.set_tags({f"bertrace.output.{Path(path).name}": digest})
        return digest

    def add_upstream(self, stage: str) -> dict[str, Any] | None:
        record = upstream_record(stage)
        if record is not None:
            self.upstream[stage] = record
        return record

    def set_tags(self, tags: dict[str, Any]) -> None:
        if self._mlflow is not None:
            self._mlflow.set_tags({k: str(v) for k, v in tags.items()})

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if self._mlflow is not None:
            numeric = {k: float(v) for k, v in tracking.flatten(metrics).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            self._mlflow.log_metrics(numeric, step=step)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        if self._mlflow is not None and Path(path).exists():
            self._mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def provenance(self) -> dict[str, Any]:
        return prov.build_record(
            self.stage,
            self.params,
            inputs=self.inputs,
            outputs=self.outputs,
            upstream=self.upstream,
            extra=self.extra or None,
            run_id=self.run_id,
            mlflow_run_id=self.mlflow_run_id,
            started=self.started,
        )

    def write_provenance(self, path: str | os.PathLike | None = None) -> Path:
        path = Path(path) if path else PROVENANCE_DIR / f"{self.stage}.json"
        write_json(path, self.provenance())
        self.log_artifact(path)
        return path

    def write_metrics(self, metrics: dict[str, Any], path: str | os.PathLike | None = None) -> Path:
        """Write the stage's DVC metrics file and log the same numbers to MLflow."""
        path = Path(path) if path else METRICS_DIR / f"{self.stage}.json"
        write_json(path, metrics)
        self.log_metrics(metrics)
        return path


def _system_tags() -> dict[str, str]:
    """Where the stage ran: host, CPUs, Python, torch and accelerator (when torch is loaded)."""
    import platform

    tags = {"bertrace.host": platform.node(), "bertrace.cpus": str(os.cpu_count()),
            "bertrace.python": platform.python_version(), "bertrace.platform": platform.platform()}
    torch = sys.modules.get("torch")
    if torch is not None:
        tags["bertrace.torch"] = torch.__version__
        tags["bertrace.torch_threads"] = str(torch.get_num_threads())
        if torch.cuda.is_available():
            tags["bertrace.cuda_device"] = torch.cuda.get_device_name(0)
            tags["bertrace.cuda_devices"] = str(torch.cuda.device_count())
    return tags


def run_stage(main: Callable[[], Any]) -> None:
    """Run a stage's ``main``; user errors print one line and exit 2, no traceback."""
    try:
        main()
    except BertraceError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception:
        traceback.print_exc()
        print("error: unexpected failure (a bug in bertrace, please report it with the traceback above)", file=sys.stderr)
        sys.exit(1)
