"""Task engines: a Dask LocalCluster runs tasks with the settings that keep its CPU cost down and
hands back exactly what the local engine does."""

from __future__ import annotations

import pytest

from pipeline.core.errors import BertraceError
from pipeline.data.engine import LOCAL_CLUSTER_CONFIG, Engine, run_tasks


def _task(shared: str, rows: list[tuple[str, str]], blob: bytes):
    """Rows and bytes in, a list of tuples out (the shapes clean's tasks use), plus the worker's
    settings named in LOCAL_CLUSTER_CONFIG."""
    import dask

    if blob == b"fail":
        raise BertraceError("bad task input")
    kept = [(f"{shared}{text}\n".encode(), len(text) / 7, len(text), source) for text, source in rows]
    return kept, blob[::-1], {key: dask.config.get(key) for key in LOCAL_CLUSTER_CONFIG}


TASKS = [([(f"line {i}.{j} \u00e9", f"src{i % 2}") for j in range(50)], bytes([i]) * 1000) for i in range(12)]


def test_dask_local_cluster_returns_the_local_results_in_order():
    pytest.importorskip("distributed", reason="pip install 'bertrace[dask]'")
    local = list(run_tasks(_task, "> ", TASKS, Engine("local", 1), ordered=True))
    dask = list(run_tasks(_task, "> ", TASKS, Engine("dask", 2), ordered=True))
    assert [(args, result[:2]) for args, result in dask] == [(args, result[:2]) for args, result in local]
    # the workers ran without the statistical profiler and with a 1 s event-loop tick
    assert {str(result[2]) for _, result in dask} == {str(LOCAL_CLUSTER_CONFIG)}
    unordered = list(run_tasks(_task, "> ", TASKS, Engine("dask", 2)))
    assert sorted(unordered, key=lambda r: r[0][1]) == sorted(dask, key=lambda r: r[0][1])


def test_dask_task_error_is_one_bertrace_error():
    pytest.importorskip("distributed", reason="pip install 'bertrace[dask]'")
    with pytest.raises(BertraceError, match="bad task input"):
        list(run_tasks(_task, "", [([], b"ok"), ([], b"fail")], Engine("dask", 1), ordered=True))
