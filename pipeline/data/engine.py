"""Where the data stages' independent tasks run: this machine's cores, or a Dask cluster.

A task is ``fn(shared, *args)``; ``shared`` (the tokenizer and config, say) is the same for
every task and sent to each worker once. Tasks are submitted lazily, at most
``2 * workers`` at a time, so the caller streams its input and holds a bounded number of
results in memory, whatever the corpus size. Results come back in completion order, or in
submission order with ``ordered=True`` (a slow task then holds the window: like
``Pool.imap``); every task's output depends only on its arguments, which is what makes the
bytes identical for any number of workers and either engine.

* ``local`` (default): ``workers`` processes of this machine (0 = all cores; 1 = in this
  process), a ``spawn`` process pool.
* ``dask``: the workers of a running ``distributed`` cluster at ``scheduler``
  (``tcp://host:8786``; ``dask scheduler`` + ``dask worker`` on each machine, or any Dask
  deployment: Kubernetes, SLURM via dask-jobqueue, ...). Without an address a LocalCluster of
  ``workers`` processes is started (useful to try it). Workers need bertrace installed at the
  same version; no shared filesystem is needed (inputs travel with the tasks, outputs come
  back to this process).

The engine is chosen by the stage's params (``engine``, ``dask_scheduler``) or the
environment (``BERTRACE_ENGINE``, ``BERTRACE_DASK_SCHEDULER``), which win.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import pickle
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Iterable, Iterator, Literal

from pydantic import Field

from pipeline.core.config import Int, Section, Str
from pipeline.core.errors import BertraceError

ENGINES = ("local", "dask")
# A LocalCluster's settings, which cost CPU every second whatever the work: no statistical profiler
# sampling every thread's stack every 10 ms (the dashboard shows it; there is none), the event-loop
# latency check every second, not 20 ms, and the host metrics (CPU, network, disk) every 5 s, not 0.5 s.
LOCAL_CLUSTER_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "5s",
}


class EngineParams(Section):
    """The keys of a data stage's params section that say where the work runs (output bytes
    depend on none of them; dvc.yaml does not track them)."""

    workers: Annotated[Int, Field(ge=0)] = 0  # local processes; 0 = all cores
    engine: Literal["local", "dask"] = "local"  # env BERTRACE_ENGINE wins
    dask_scheduler: Str = ""  # env BERTRACE_DASK_SCHEDULER wins; empty = a LocalCluster

    @classmethod
    def recipe_keys(cls) -> tuple[str, ...]:
        """The section's keys that determine the output bytes: dvc.yaml tracks exactly these, and
        the stage's record holds only these (so the worker count changes no output)."""
        return tuple(k for k in cls.model_fields if k not in EngineParams.model_fields)


@dataclass(frozen=True)
class Engine:
    kind: str = "local"
    workers: int = 0  # local: processes (0 = all cores); dask without scheduler: LocalCluster size
    scheduler: str | None = None  # dask: scheduler address; None = start a LocalCluster

    @classmethod
    def from_params(cls, params: dict | EngineParams, section: str) -> "Engine":
        """The engine of a params.yaml section (``workers``, ``engine``, ``dask_scheduler``) + env."""
        if isinstance(params, EngineParams):
            params = params.model_dump()
        kind = os.environ.get("BERTRACE_ENGINE") or params.get("engine") or "local"
        scheduler = os.environ.get("BERTRACE_DASK_SCHEDULER") or params.get("dask_scheduler") or None
        workers = params.get("workers", 0)
        if kind not in ENGINES:
            raise BertraceError(
                f"params.yaml {section}.engine = {kind!r} (or env BERTRACE_ENGINE): must be one of {', '.join(ENGINES)}"
            )
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise BertraceError(
                f"params.yaml {section}.workers = {workers!r}: must be an integer >= 0 (0 = all cores); fix params.yaml"
            )
        return cls(kind, workers, scheduler)

    @property
    def local_workers(self) -> int:
        return self.workers or os.cpu_count() or 1


def run_tasks(
    fn: Callable,
    shared: Any,
    tasks: Iterable[tuple],
    engine: Engine,
    *,
    initializer: Callable | None = None,
    what: str = "task",
    ordered: bool = False,
    preload: tuple[str, ...] = (),
) -> Iterator[tuple[tuple, Any]]:
    """Yield ``(args, fn(shared, *args))`` for every ``args`` in ``tasks``, as they finish
    (``ordered``: in the order of ``tasks``).

    ``initializer`` runs once in each local pool process (e.g. to set environment variables).
    ``what`` names the work in error messages. ``preload``: modules slow to import (Great
    Expectations: ~5 CPU-s) that local workers then inherit from a fork server instead of each
    importing them (:func:`process_context`).
    """
    if engine.kind == "dask":
        yield from _run_dask(fn, shared, tasks, engine, what, ordered)
    elif engine.local_workers == 1:
        for args in tasks:
            yield args, fn(shared, *args)
    else:
        yield from _run_pool(fn, shared, tasks, engine.local_workers, initializer, what, ordered, preload)


def process_context(preload: tuple[str, ...] = ()):
    """How local workers start: ``spawn`` (a fresh interpreter), or, with ``preload`` where the OS
    has it (Linux), ``forkserver`` with those modules imported once in the server, so each
    worker forks with them loaded (no threads or state of this process are copied either way)."""
    if preload and "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))
        return ctx
    return mp.get_context("spawn")


def start_fork_server(engine: Engine, preload: tuple[str, ...]) -> None:
    """Start the fork server of :func:`process_context` now, when ``engine`` will start local
    processes (a pool of local workers, :class:`Beside`): its imports of ``preload`` (seconds for
    Great Expectations) then run on another core while the caller goes on, instead of delaying the
    first process the caller starts."""
    if (engine.kind == "dask" or engine.local_workers > 1) and preload:
        if process_context(preload).get_start_method() == "forkserver":
            from multiprocessing import forkserver

            forkserver.ensure_running()


class Beside:
    """``fn(*args, **kwargs)`` in one more local process while the caller goes on (when ``engine``
    has more than one worker: a Dask cluster, or local cores), else in this process when
    :meth:`result` asks for it. For independent work that would otherwise run before or after
    the engine's tasks (validate's corpus checks beside its shard checks)."""

    def __init__(self, engine: Engine, what: str, fn: Callable, *args, preload: tuple[str, ...] = (), **kwargs):
        self.what, self.call = what, (fn, args, kwargs)
        self.pool = None
        if engine.kind == "dask" or engine.local_workers > 1:
            self.pool = cf.ProcessPoolExecutor(1, mp_context=process_context(preload))
            self.future = self.pool.submit(fn, *args, **kwargs)

    def result(self) -> Any:
        if self.pool is None:
            fn, args, kwargs = self.call
            return fn(*args, **kwargs)
        try:
            return self.future.result()
        except cf.process.BrokenProcessPool:
            raise BertraceError(f"{self.what}: its process died (out of memory?); rerun with workers: 1") from None
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _run_pool(fn, shared, tasks, workers: int, initializer, what: str, ordered: bool, preload=()):
    ctx = process_context(preload)

    def finished(pending: dict):
        """The futures to hand back next: the oldest (ordered; dicts keep insertion order) or any done."""
        if ordered:
            return [next(iter(pending))]
        return cf.wait(pending, return_when=cf.FIRST_COMPLETED)[0]

    with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=initializer) as pool:
        pending: dict[cf.Future, tuple] = {}
        try:
            for args in tasks:
                while len(pending) >= 2 * workers:  # bounded: never read far ahead
                    for fut in finished(pending):
                        yield pending.pop(fut), fut.result()
                pending[pool.submit(fn, shared, *args)] = args
            while pending:
                for fut in finished(pending):
                    yield pending.pop(fut), fut.result()
        except cf.process.BrokenProcessPool:
            raise BertraceError(
                f"{what}: a worker process died (out of memory? or a script that calls it without an "
                "`if __name__ == '__main__':` guard, which the 'spawn' start method needs); rerun with "
                "workers: 1 to see the cause"
            ) from None
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _dask_client(engine: Engine, what: str):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise BertraceError(
            f"{what}: engine 'dask' needs the distributed package; pip install 'bertrace[dask]' (or set engine: local)"
        ) from None
    if engine.scheduler:
        try:
            return Client(engine.scheduler, timeout="30s"), None
        except OSError as e:
            raise BertraceError(
                f"{what}: cannot reach the Dask scheduler at {engine.scheduler} ({e}); check "
                "dask_scheduler / BERTRACE_DASK_SCHEDULER and that `dask scheduler` runs"
            ) from None
    import dask

    with dask.config.set(LOCAL_CLUSTER_CONFIG):  # the workers (their nannies pass it on) and the scheduler
        cluster = LocalCluster(
            n_workers=engine.local_workers, threads_per_worker=1, processes=True, dashboard_address=None
        )
    # This machine reaches its own workers: arguments and results skip the hop through the scheduler.
    return Client(cluster, direct_to_workers=True), cluster


def _run_dask(fn, shared, tasks, engine: Engine, what: str, ordered: bool):
    from distributed import wait

    client, cluster = _dask_client(engine, what)
    try:
        slots = 2 * max(1, sum(client.nthreads().values()))
        shared_f = client.scatter(shared, broadcast=True, hash=False)
        pending: dict = {}

        def next_done():
            if ordered:  # the oldest task, like the local pool
                first = next(iter(pending))
                wait([first])
                return [first]
            return wait(list(pending), return_when="FIRST_COMPLETED")[0]

        def finished(futures):
            for fut in futures:
                args = pending.pop(fut)
                try:
                    result = pickle.loads(fut.result())
                except Exception as e:  # a worker's exception is re-raised here with its traceback
                    if isinstance(e, BertraceError):
                        raise
                    raise BertraceError(f"{what}: a Dask task failed on the cluster: {type(e).__name__}: {e}") from e
                fut.release()
                yield args, result

        for args in tasks:
            while len(pending) >= slots:
                yield from finished(next_done())
            # Arguments (a partition's text) travel as data, not in the task graph; from a LocalCluster's
            # client straight to a worker.
            data = client.scatter(_pickled(args), hash=False)
            pending[client.submit(_dask_call, fn, shared_f, data, pure=False)] = args
        while pending:
            yield from finished(next_done())
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _pickled(obj) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _dask_call(fn, shared, args: bytes) -> bytes:
    """One task on a Dask worker. Arguments and result travel as one pickle each: Dask's own
    serialisation walks a list or tuple item by item (a header per item), which costs more CPU
    than the task itself when the items are a chunk's rows or its articles."""
    return _pickled(fn(shared, *pickle.loads(args)))
