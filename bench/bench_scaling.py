"""Data stages as the corpus grows: clean, tokenizer and examples on the corpus replicated 1x,
4x, 16x (each replica's articles renamed, so de-duplication keeps them): wall time and peak
RSS per stage, each stage its own process (bench/stage_runner.py).

Goals: 16x the corpus in <= 18x the time (linear), peak RSS at 16x < 1.5x that at 1x (flat).

    python bench/bench_scaling.py [--source wikitext] [--scales 1 4 16]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import corpus  # noqa: E402
import measure  # noqa: E402

STAGES = ("clean", "tokenizer", "examples")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="wikitext", help="wikitext (1.3 MB) or enwikiN (N MB)")
    p.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--workers", type=int, default=0)
    p.add_argument(
        "--docs-per-shard",
        type=int,
        default=16,
        help="examples partition size; memory is flat once the 1x corpus fills a few partitions",
    )
    p.add_argument("--work", type=Path, default=BENCH / "out" / "scaling")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    py, runner = sys.executable, str(BENCH / "stage_runner.py")
    table: dict = {}
    for scale in args.scales:
        work = args.work / f"{args.source}-x{scale}"
        if work.exists():
            shutil.rmtree(work)
        corpus.replicate(args.source, scale, work / "src")
        corpus.download(work / "src", work / "raw")  # not timed: the download stage only copies rows
        runs = {
            "clean": measure.run(
                [py, runner, "clean", str(work / "raw"), str(work / "clean"), "--workers", str(args.workers)]
            ),
            "tokenizer": measure.run([py, runner, "tokenizer", str(work / "clean"), str(work / "tokenizer")]),
            "examples": measure.run(
                [
                    py,
                    runner,
                    "examples",
                    str(work / "clean"),
                    str(work / "tokenizer/tokenizer.json"),
                    str(work / "examples"),
                    "--workers",
                    str(args.workers),
                    "--docs-per-shard",
                    str(args.docs_per_shard),
                ]
            ),
        }
        rows = json.loads(runs["examples"].stdout.strip().splitlines()[-1])
        table[scale] = {
            "raw_mb": sum(f.stat().st_size for f in (work / "src").iterdir()) / 1e6,
            "n_examples": rows["train"]["rows"] + rows["valid"]["rows"],
            **{
                stage: {
                    "wall_s": r.wall_s,
                    "peak_rss_mb": r.peak_tree_mb,
                    "peak_rss_largest_process_mb": r.peak_proc_mb,
                }
                for stage, r in runs.items()
            },
        }
        shutil.rmtree(work)  # 16x of the data is a few hundred MB of shards

    base, top = min(args.scales), max(args.scales)
    print(f"scaling on {args.source} replicated {args.scales}")
    print(
        f"{'scale':>5s} {'raw MB':>7s} {'examples':>9s} "
        + " ".join(f"{s + ' s':>12s} {s + ' MB':>12s}" for s in STAGES)
    )
    for scale, row in table.items():
        print(
            f"{scale:>4d}x {row['raw_mb']:7.1f} {row['n_examples']:9d} "
            + " ".join(f"{row[s]['wall_s']:12.2f} {row[s]['peak_rss_mb']:12.0f}" for s in STAGES)
        )
    summary = {}
    for s in STAGES:
        t = table[top][s]["wall_s"] / table[base][s]["wall_s"]
        m = table[top][s]["peak_rss_mb"] / table[base][s]["peak_rss_mb"]
        summary[s] = {"time_ratio": t, "rss_ratio": m}
        print(
            f"{s:10s} {top // base}x corpus: time x{t:.1f} (goal <= {18 * top // base / 16:.0f}), "
            f"peak RSS x{m:.2f} (goal < 1.5)"
        )
    result = {"source": args.source, "scales": table, "summary": summary}
    return measure.save_result(args.json, result)


if __name__ == "__main__":
    main()
