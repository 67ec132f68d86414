"""MLflow plumbing: where runs go and how params/tags are flattened.

Default store: a SQLite file ``mlflow.db`` in the working directory (the repo root when DVC
runs a stage) with artifacts under ``mlartifacts/``; ``MLFLOW_TRACKING_URI`` overrides both
(any server or store MLflow supports). The experiment is ``bertrace`` unless
``MLFLOW_EXPERIMENT_NAME`` says otherwise.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

DEFAULT_EXPERIMENT = "bertrace"
MAX_PARAM_CHARS = 6000  # MLflow's limit on one param value


def default_tracking_uri(root: str | os.PathLike = ".") -> str:
    return "sqlite:///" + str(Path(root, "mlflow.db").resolve())


def tracking_uri(root: str | os.PathLike = ".") -> str:
    """``MLFLOW_TRACKING_URI`` when set, else ``<root>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(root)


def setup_mlflow(root: str | os.PathLike = "."):
    """Point MLflow at the configured store and return the experiment id."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    import mlflow

    explicit = bool(os.environ.get("MLFLOW_TRACKING_URI"))  # read first: set_tracking_uri sets the variable
    mlflow.set_tracking_uri(tracking_uri(root))
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_EXPERIMENT)
    experiment = mlflow.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    artifact_location = None
    if not explicit:
        artifact_location = Path(root, "mlartifacts").resolve().as_uri()
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


def mlflow_params(params: dict[str, Any]) -> dict[str, str]:
    return {k: str(v)[:MAX_PARAM_CHARS] for k, v in flatten(params).items()}
