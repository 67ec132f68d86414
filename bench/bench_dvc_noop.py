"""`dvc repro` with nothing changed: how long DVC takes to find that every stage is up to date.

The bench copies this working tree (tracked and untracked, not ignored files) to a scratch git
repository, runs the data half of the default pipeline once with the default params
(download → clean → tokenizer → examples, WikiText-2 through the hub mirror of ../shared/data),
then times ``dvc repro examples`` again, several times, nothing changed. The model stages
(pretrain, finetune, evaluate) are not run here: each would add one stage check to the no-op
(hashing a handful of files whose sizes DVC caches by mtime), not a pass over the data.

    python bench/bench_dvc_noop.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import measure  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--target", default="examples")
    p.add_argument("--work", type=Path, default=BENCH / "out" / "dvc-noop")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    repo = args.work / "repo"
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True
        )
        .stdout.decode()
        .split("\0")
    )
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file() and not f.startswith("bench/out/"):
            (repo / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / f)
    shared = ROOT.parent / "shared"
    if shared.exists() and not (args.work / "shared").exists():
        (args.work / "shared").symlink_to(shared)  # the mirror's ../../shared/data paths resolve from the copy
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        BERTRACE_NO_MLFLOW="1",
        BERTRACE_HUB_MIRROR="mirrors/shared-data.yaml",
        TQDM_DISABLE="1",
    )
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    for cmd in (git + ["init", "-q"], git + ["add", "-A"], git + ["commit", "-qm", "bench"]):
        subprocess.run(cmd, cwd=repo, check=True)
    first = measure.run(["dvc", "repro", args.target], cwd=repo, env=env)
    noop = [measure.run(["dvc", "repro", args.target], cwd=repo, env=env) for _ in range(args.runs)]
    for r in noop:
        if "didn't change" not in r.stdout + r.stderr and "up to date" not in r.stdout + r.stderr:
            raise SystemExit(f"dvc repro reran something:\n{r.stdout[-2000:]}")
    walls = [r.wall_s for r in noop]
    result = {
        "target": args.target,
        "first_run_s": first.wall_s,
        "noop_s": walls,
        "noop_median_s": statistics.median(walls),
    }
    print(
        f"dvc repro {args.target}: first run {first.wall_s:.1f} s; nothing changed: "
        + ", ".join(f"{w:.2f}" for w in walls)
        + f" s (median {result['noop_median_s']:.2f} s, goal < 5 s)"
    )
    return measure.save_result(args.json, result)


if __name__ == "__main__":
    main()
