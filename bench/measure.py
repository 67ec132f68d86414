"""Run a command and measure it: wall time, peak RSS of the whole process tree, peak RSS of its
largest process, and CPU seconds. Shared by the data-stage benches.

The tree's memory is sampled every 20 ms with psutil (a dvc dependency, so always installed):
RSS summed over the command and all its descendants (worker processes included), the largest
single process's RSS, and PSS summed over the tree. Summed RSS counts the pages of a shared
library once per process that maps it (our 3 processes each count pyarrow's ~60 MB); PSS
(proportional set size, Linux ``/proc/PID/smaps_rollup``) splits each shared page between the
processes that map it, so its sum is the tree's real share of physical memory. For a single
process the two are about equal. CPU seconds are the children's user + system time, or the sum of
the tree's sampled per-process CPU where larger (workers of a fork server are not our children).
"""

from __future__ import annotations

import os
import resource
import subprocess
import threading
import time
from dataclasses import dataclass

import psutil


@dataclass
class Run:
    wall_s: float
    peak_tree_mb: float  # sum over the process tree, sampled
    peak_proc_mb: float  # largest single process, sampled
    peak_pss_mb: float  # PSS summed over the process tree, sampled (0 where the OS has no PSS)
    cpu_s: float
    stdout: str
    stderr: str
    returncode: int


def _tree_memory(proc: psutil.Process, full: bool = True, cpu: dict | None = None) -> tuple[int, int, int]:
    """(RSS sum, largest RSS, PSS sum) over a process and its descendants (``full=False``: no PSS,
    which reads each process's smaps_rollup and costs a busy process's sampler ~30 % of a core)."""
    total = largest = pss = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            info = p.memory_full_info() if full else p.memory_info()  # rss: /proc/PID/statm; pss: smaps_rollup
            if cpu is not None:  # each process's own CPU so far (a fork server's workers are not our children)
                t = p.cpu_times()
                cpu[(p.pid, p.create_time())] = t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total, largest, pss = total + info.rss, max(largest, info.rss), pss + getattr(info, "pss", 0)
    return total, largest, pss


def run(cmd: list[str], *, cwd=None, env=None, check: bool = True, interval: float = 0.02, pss: bool = True) -> Run:
    """Run ``cmd`` to completion and measure it (stdout/stderr are captured); ``pss=False``: RSS only."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = peak_one = peak_pss = 0
    seen_cpu: dict = {}
    stop = threading.Event()

    def sample():
        nonlocal peak, peak_one, peak_pss
        try:
            ps = psutil.Process(proc.pid)
            while not stop.is_set():
                total, largest, shared = _tree_memory(ps, pss, seen_cpu)
                peak, peak_one, peak_pss = max(peak, total), max(peak_one, largest), max(peak_pss, shared)
                stop.wait(interval)
        except psutil.NoSuchProcess:
            pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # Processes reaped by someone else (a fork server's workers) are missing from RUSAGE_CHILDREN: the
    # sampled per-process CPU (each process's last sample, up to one interval short) covers them.
    cpu = max(cpu, sum(seen_cpu.values()))
    if check and proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
    return Run(
        wall_s=wall,
        peak_tree_mb=peak / 2**20,
        peak_proc_mb=peak_one / 2**20,
        peak_pss_mb=peak_pss / 2**20,
        cpu_s=cpu,
        stdout=out,
        stderr=err,
        returncode=proc.returncode,
    )


def machine() -> str:
    """One line about this machine: CPU model, cores, memory, OS."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    mem = psutil.virtual_memory().total / 2**30
    return f"{model or 'unknown CPU'}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, {os.uname().sysname} {os.uname().release}"


def save_result(path, result: dict) -> dict:
    """Write a bench result as JSON to ``path`` (a pathlib.Path, or None: don't), return it."""
    if path:
        import json

        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    return result
