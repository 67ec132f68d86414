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


def _where(fail: bool = False, *, tag: str = "") -> tuple[int, str, bool]:
    """This process's pid, a tag, and whether the preloaded module was already imported."""
    import os
    import sys

    if fail:
        raise BertraceError("tokenizer.json: not found")
    return os.getpid(), tag, "xml.dom.minidom" in sys.modules


def test_beside_runs_in_another_process_only_with_more_than_one_worker():
    import os

    from pipeline.data.engine import Beside

    pid, tag, _ = Beside(Engine("local", 1), "validate", _where, tag="one").result()
    assert pid == os.getpid() and tag == "one"
    pid, tag, _ = Beside(Engine("local", 2), "validate", _where, tag="two").result()
    assert pid != os.getpid() and tag == "two"
    with pytest.raises(BertraceError, match="tokenizer.json: not found"):
        Beside(Engine("local", 2), "validate", _where, True).result()


def test_preloaded_modules_reach_the_workers_already_imported():
    """A fresh interpreter (the fork server's preload is fixed when it first starts)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = (
        "from pipeline.data.engine import Beside, Engine\n"
        "from tests.unit.data.test_engine import _where\n"
        "if __name__ == '__main__':\n"
        "    print(Beside(Engine('local', 2), 'x', _where, preload=('xml.dom.minidom',)).result()[2])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr[-2000:]
