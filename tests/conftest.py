"""Shared fixtures: paths to the repo and to the offline data in ../shared/data."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from pipeline.core.arithmetic import ComputeConfig, pin_process

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two pytest workers (pytest-xdist). Each, and every stage it starts (dvc repro,
    # torchrun: they inherit the variable), uses one torch thread: two workers at the machine's
    # thread count each would oversubscribe the cores and spin (README: two such dvc exp runs, ~18x slower).
    # Set before torch is imported, which reads it once.
    os.environ["OMP_NUM_THREADS"] = "1"

# The tests run torch as the stages do by default (params.yaml compute.kernels: portable): the kernel
# pins go into the environment before torch loads, for this process and the stages it starts, and
# MKL's vendor shim is loaded (AMD CPUs).
pin_process(ComputeConfig())


@functools.cache
def _mlflow_template() -> Path:
    """An empty MLflow SQLite store made by MLflow itself, once per test process."""
    from mlflow.tracking import MlflowClient

    folder = Path(tempfile.mkdtemp(prefix="bertrace-mlflow-template-"))
    atexit.register(shutil.rmtree, folder, True)
    MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
    return folder / "mlflow.db"


def empty_mlflow_store(dest: Path) -> Path:
    """Copy an empty MLflow SQLite store to ``dest``: creating the schema (its migrations) takes
    ~2-3 s, copying the template a millisecond."""
    shutil.copyfile(_mlflow_template(), dest)
    return dest


@pytest.fixture(autouse=True)
def _isolated_mlflow(tmp_path_factory, monkeypatch):
    """Every test logs to its own throw-away MLflow store, never the repo's mlflow.db: a copy
    of the empty template (stages run as subprocesses inherit the variable)."""
    if "MLFLOW_TRACKING_URI" not in os.environ:
        store = tmp_path_factory.mktemp("mlflow")
        empty_mlflow_store(store / "mlflow.db")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}/mlflow.db")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    yield


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module (``pytestmark = pytest.mark.usefixtures("one_thread")``): tiny
    models run fastest without thread sync, and CI machines are shared."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def shared_file(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not available (the offline data folder ../shared/data)")
    return path
