"""Clean stage, 1 process vs all cores: wall time, peak RSS (tree) and identical output bytes.

The raw corpus is the first N files of the WikiExtractor extract (``--source enwikiN``, ~N MB),
read through the download stage untimed; each run is its own process (bench/stage_runner.py).

    python bench/bench_clean.py [--source enwiki50] [--workers 1 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import corpus  # noqa: E402
import measure  # noqa: E402


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="enwiki50", help="enwikiN: the first N 1-MB files of the extract")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 0], help="0 = all cores")
    p.add_argument("--work", type=Path, default=BENCH / "out" / "clean")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    work = args.work / args.source
    if not (work / "raw" / "manifest.json").exists():
        corpus.replicate(args.source, 1, work / "src")
        corpus.download(work / "src", work / "raw")
    runs = {}
    for w in args.workers:
        out = work / f"clean-w{w}"
        r = measure.run(
            [sys.executable, str(BENCH / "stage_runner.py"), "clean", str(work / "raw"), str(out), "--workers", str(w)]
        )
        runs[w] = {
            "wall_s": r.wall_s,
            "peak_rss_mb": r.peak_tree_mb,
            "peak_pss_mb": r.peak_pss_mb,
            "cpu_s": r.cpu_s,
            "sha256": {n: _sha(out / n) for n in ("train.txt", "valid.txt")},
            "documents": json.loads(r.stdout.strip().splitlines()[-1])["documents"],
        }
    raw_mb = sum(f.stat().st_size for f in (work / "src").iterdir()) / 1e6
    identical = len({json.dumps(r["sha256"]) for r in runs.values()}) == 1
    print(f"clean on {args.source} ({raw_mb:.1f} MB raw)")
    print(f"{'workers':>8s} {'wall s':>8s} {'MB/s':>7s} {'peak RSS MB':>12s} {'peak PSS MB':>12s} {'CPU s':>7s}")
    for w, r in runs.items():
        print(
            f"{w:8d} {r['wall_s']:8.2f} {raw_mb / r['wall_s']:7.1f} {r['peak_rss_mb']:12.0f} "
            f"{r['peak_pss_mb']:12.0f} {r['cpu_s']:7.2f}"
        )
    print(f"output bytes identical across workers: {identical}")
    if not identical:
        raise SystemExit("clean: outputs differ between worker counts")
    result = {"source": args.source, "raw_mb": raw_mb, "runs": runs, "identical": identical}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    for w in args.workers:
        shutil.rmtree(work / f"clean-w{w}", ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
