"""The data half at Wikipedia scale: download → clean → tokenizer → examples → validate, each the
real DVC stage (``python -m stages.<name>``, MLflow off) in its own process, on synthetic
Wikipedia-like corpora (bench/synth_corpus.py: Zipf word frequencies, Heaps vocabulary growth,
~3 KB articles) of the sizes asked for.

Prints per stage and size: CPU seconds per GB of corpus, wall, peak RSS (largest process and the
whole tree) and the disk its outputs take; the whole half's CPU-s/GB; how much faster 1 → N
workers make the costly stages; the disk of the outputs with and without DVC's cache (``dvc add``
with the repository's ``cache.type``); and the projection for a 20 GB corpus on N cores.

    python bench/bench_data_half.py                      # 0.1 and 1 GB, 2 workers, scaling at 0.1 GB
    python bench/bench_data_half.py --scaling-size 1 --pairs 3   # 1 vs 2 workers at 1 GB, 3 paired runs
    python bench/bench_data_half.py --sizes 2 --no-scaling --no-dvc   # memory at 2 GB
    python bench/bench_data_half.py --repo ../old-checkout --sizes 0.1  # the same corpus through other code

Goals (issue #50): <= 600 CPU-s per GB end to end; tokenizer, examples, validate 2 workers >= 1.6x
one; peak RSS per process <= 2 GB at 2 GB; disk with the cache <= 1.3x the outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import measure  # noqa: E402
import synth_corpus  # noqa: E402

STAGES = ("download", "clean", "tokenizer", "examples", "validate")
SCALED = ("tokenizer", "examples", "validate")  # the costly ones, timed again with 1 worker
OUTPUTS = {
    "download": ["data/raw"],
    "clean": ["data/clean"],
    "tokenizer": ["data/tokenizer"],
    "examples": ["data/examples"],
    "validate": ["reports/validate.json", "reports/data_docs", "metrics/validate.json"],
}
GB = 1e9


def du(paths: list[Path]) -> int:
    """Bytes on disk under ``paths``, each inode counted once (a hard link to the cache is free)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root in paths:
        if not root.exists():
            continue
        for p in [root] if root.is_file() else root.rglob("*"):
            st = p.lstat()
            if p.is_symlink() or not p.is_file() or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def write_params(repo: Path, work: Path, workers: int, engine: str = "local") -> None:
    """The repository's params.yaml for a local WikiExtractor corpus, every data stage on ``workers``
    (keys the code under test lacks are left out)."""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["download"].update(source="local")
    params["download"]["local"].update(path="src", format="wikiextractor")
    for section in ("clean", "tokenizer", "examples", "validate"):
        if "workers" in params.get(section, {}):
            params[section]["workers"] = workers
        if "engine" in params.get(section, {}):
            params[section]["engine"] = engine
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def run_stage(repo: Path, work: Path, stage: str) -> measure.Run:
    env = dict(os.environ, PYTHONPATH=str(repo), BERTRACE_NO_MLFLOW="1", TQDM_DISABLE="1", OMP_NUM_THREADS="1")
    # RSS sampled every 50 ms without PSS: the sampler then takes ~2 % of a core, not ~30 %
    run = measure.run(
        [sys.executable, "-m", f"stages.{stage}"], cwd=work, env=env, check=False, interval=0.05, pss=False
    )
    if run.returncode != 0:
        raise SystemExit(f"{stage} failed ({run.returncode}) in {work}:\n{run.stderr[-3000:]}")
    return run


def dvc_disk(repo: Path, work: Path) -> dict:
    """Outputs' disk alone, then with DVC's cache after ``dvc add`` (the repository's cache.type)."""
    outs = [work / p for stage in STAGES for p in OUTPUTS[stage] if p.startswith("data/")]
    before = du(outs)
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    # the repository's own setting, read by DVC (empty: DVC's default)
    got = subprocess.run(["dvc", "config", "cache.type"], cwd=repo, env=env, capture_output=True, text=True)
    cache_type = got.stdout.strip() or "reflink,copy"
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "cache.type", cache_type]):
        subprocess.run(cmd, cwd=work, env=env, check=True, capture_output=True)
    rel = [str(p.relative_to(work)) for p in outs]
    run = measure.run([sys.executable, "-m", "dvc", "add", "-q", *rel], cwd=work, env=env)
    after = du([*outs, work / ".dvc" / "cache"])
    return {
        "cache_type": cache_type,
        "outputs_gb": before / GB,
        "with_cache_gb": after / GB,
        "ratio": after / before,
        "dvc_add_s": run.wall_s,
    }


def bench_size(
    repo: Path,
    work: Path,
    gb: float,
    workers: int,
    *,
    scaling: bool,
    dvc: bool,
    seed: int,
    dask: bool = False,
    pairs: int = 1,
) -> dict:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    corpus = synth_corpus.write_corpus(work / "src", int(gb * GB), seed=seed)
    real_gb = corpus["bytes"] / GB
    write_params(repo, work, workers)
    stages = {}
    for stage in STAGES:
        r = run_stage(repo, work, stage)
        stages[stage] = {
            "cpu_s": r.cpu_s,
            "cpu_s_per_gb": r.cpu_s / real_gb,
            "wall_s": r.wall_s,
            "peak_rss_mb": r.peak_proc_mb,
            "peak_tree_rss_mb": r.peak_tree_mb,
            "disk_gb": du([work / p for p in OUTPUTS[stage]]) / GB,
        }
    result = {"corpus": corpus, "gb": real_gb, "workers": workers, "stages": stages}
    if scaling:  # each costly stage again: 1 worker, then N, `pairs` times in turn (a drifting machine hits both)
        result["one_worker"] = {}
        for stage in SCALED:
            runs = {1: [], workers: []}
            for _ in range(pairs):
                for w in (1, workers):
                    write_params(repo, work, w)
                    runs[w].append(run_stage(repo, work, stage))
            speedups = sorted(a.wall_s / b.wall_s for a, b in zip(runs[1], runs[workers]))
            result["one_worker"][stage] = {
                "wall_s": statistics.median(r.wall_s for r in runs[1]),
                "cpu_s": statistics.median(r.cpu_s for r in runs[1]),
                "n_wall_s": [round(r.wall_s, 2) for r in runs[workers]],
                "speedups": [round(x, 3) for x in speedups],
                "speedup": statistics.median(speedups),  # of the pairs: what the report and projection use
            }
        write_params(repo, work, workers)
    if dask:  # clean on the local engine, then on a LocalCluster of as many workers, `pairs` times in turn
        runs = {"local": [], "dask": []}
        for _ in range(pairs):
            for engine in runs:
                write_params(repo, work, workers, engine=engine)
                runs[engine].append(run_stage(repo, work, "clean"))
        ratios = sorted(d.cpu_s / lo.cpu_s for lo, d in zip(runs["local"], runs["dask"]))
        result["clean_dask"] = {
            "wall_s": statistics.median(r.wall_s for r in runs["dask"]),
            "cpu_s": statistics.median(r.cpu_s for r in runs["dask"]),
            "local_cpu_s": statistics.median(r.cpu_s for r in runs["local"]),
            "peak_tree_rss_mb": max(r.peak_tree_mb for r in runs["dask"]),
            "cpu_ratios": [round(x, 3) for x in ratios],
            "cpu_ratio": statistics.median(ratios),  # Dask CPU / local CPU, median of the pairs
        }
        write_params(repo, work, workers)
    if dvc:
        result["disk"] = dvc_disk(repo, work)
    return result


def project(results: list[dict], target_gb: float, cores: int) -> dict:
    """Hours for ``target_gb`` on ``cores``: per stage, CPU-s = fixed + per-GB (a line through the two
    largest sizes, or per-GB alone with one size), spread over the cores with the parallel share the
    1-vs-N-worker runs measured (Amdahl); no scaling run: all of it parallel."""
    by_size = sorted(results, key=lambda r: r["gb"])
    top = by_size[-1]
    low = by_size[-2] if len(by_size) > 1 else None
    speedup_run = next((r for r in results if "one_worker" in r), None)
    out = {}
    for stage in STAGES:
        c1, g1 = top["stages"][stage]["cpu_s"], top["gb"]
        if low:
            c0, g0 = low["stages"][stage]["cpu_s"], low["gb"]
            slope = max((c1 - c0) / (g1 - g0), 0.0)
            fixed = max(c1 - slope * g1, 0.0)
        else:
            slope, fixed = c1 / g1, 0.0
        parallel = 1.0
        if speedup_run and stage in speedup_run["one_worker"]:
            w = speedup_run["workers"]
            s = speedup_run["one_worker"][stage]["speedup"]
            parallel = min(max((1 - 1 / s) / (1 - 1 / w), 0.0), 1.0) if w > 1 else 1.0
        cpu = fixed + slope * target_gb
        out[stage] = cpu * ((1 - parallel) + parallel / cores) / 3600
    out["total"] = sum(out.values())
    return out


def report(results: list[dict], cores: list[int]) -> None:
    print(f"\n{measure.machine()}")
    for r in results:
        c = r["corpus"]
        print(
            f"\n{r['gb']:.2f} GB synthetic Wikipedia ({c['documents']:,} articles, {c['distinct_words']:,} distinct "
            f"words), {r['workers']} workers"
        )
        print(
            f"{'stage':10s} {'CPU s':>8s} {'CPU s/GB':>9s} {'wall s':>8s} {'RSS MB':>8s} {'tree MB':>8s} {'disk GB':>8s}"
        )
        for stage, s in r["stages"].items():
            print(
                f"{stage:10s} {s['cpu_s']:8.1f} {s['cpu_s_per_gb']:9.1f} {s['wall_s']:8.1f} {s['peak_rss_mb']:8.0f} "
                f"{s['peak_tree_rss_mb']:8.0f} {s['disk_gb']:8.3f}"
            )
        total = sum(s["cpu_s"] for s in r["stages"].values())
        print(f"{'total':10s} {total:8.1f} {total / r['gb']:9.1f}   (goal <= 600 CPU s/GB)")
        peak = max(s["peak_rss_mb"] for s in r["stages"].values())
        print(f"largest process: {peak:.0f} MB (goal <= 2048 MB at 2 GB)")
        if "one_worker" in r:
            for stage, one in r["one_worker"].items():
                pairs = ", ".join(f"{x:.2f}" for x in one["speedups"])
                print(
                    f"{stage:10s} 1 -> {r['workers']} workers: {one['speedup']:.2f}x faster (goal >= 1.6x; "
                    f"median of {len(one['speedups'])} paired runs: {pairs})"
                )
        if "clean_dask" in r:
            d = r["clean_dask"]
            pairs = ", ".join(f"{x:.2f}" for x in d["cpu_ratios"])
            print(
                f"clean on a Dask LocalCluster: {d['cpu_s']:.1f} CPU s (local engine {d['local_cpu_s']:.1f}), "
                f"{d['wall_s']:.1f} s wall = {d['cpu_ratio']:.2f}x the local engine's CPU (goal <= 1.2x; "
                f"median of {len(d['cpu_ratios'])} paired runs: {pairs})"
            )
        if "disk" in r:
            d = r["disk"]
            print(
                f"disk: outputs {d['outputs_gb']:.3f} GB, with the DVC cache ({d['cache_type']}) {d['with_cache_gb']:.3f}"
                f" GB = {d['ratio']:.2f}x (goal <= 1.3x)"
            )
    for n in cores:
        p = project(results, 20, n)
        per = ", ".join(f"{k} {v:.2f}" for k, v in p.items() if k != "total")
        print(f"20 GB on {n} cores: {p['total']:.1f} h ({per})")


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=float, nargs="+", default=[0.1, 1.0], help="corpus sizes in GB")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--scaling-size", type=float, default=0.1, help="rerun the costly stages with 1 worker at this size")
    p.add_argument("--no-scaling", action="store_true")
    p.add_argument(
        "--pairs",
        type=int,
        default=1,
        help="1-then-N-worker runs per scaled stage, local-then-Dask clean runs (medians)",
    )
    p.add_argument("--no-dvc", action="store_true", help="skip the dvc add disk measurement")
    p.add_argument("--dask-size", type=float, default=None, help="also run clean on a Dask LocalCluster at this size")
    p.add_argument("--repo", type=Path, default=BENCH.parent, help="the code to run (a checkout)")
    p.add_argument("--cores", type=int, nargs="+", default=[2, 8], help="project 20 GB on these core counts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=BENCH / "out" / "data_half")
    p.add_argument("--keep", action="store_true", help="keep each size's work directory")
    p.add_argument("--json", type=Path, default=BENCH / "out" / "data_half.json")
    args = p.parse_args(argv)
    results = []
    for gb in args.sizes:
        work = args.work / f"{gb:g}gb"
        scaling = not args.no_scaling and abs(gb - args.scaling_size) < 1e-9
        dask = args.dask_size is not None and abs(gb - args.dask_size) < 1e-9
        results.append(
            bench_size(
                args.repo.resolve(),
                work,
                gb,
                args.workers,
                scaling=scaling,
                dvc=not args.no_dvc,
                seed=args.seed,
                dask=dask,
                pairs=args.pairs,
            )
        )
        if not args.keep:
            shutil.rmtree(work)
        print(json.dumps({k: v for k, v in results[-1].items() if k != "corpus"}))
    report(results, args.cores)
    result = {"machine": measure.machine(), "repo": str(args.repo), "sizes": results}
    result["projection_20gb"] = {n: project(results, 20, n) for n in args.cores}
    measure.save_result(args.json, result)
    return results


if __name__ == "__main__":
    main()
