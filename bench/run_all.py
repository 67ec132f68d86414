"""All data-stage benchmarks in one command; results go to bench/out/*.json (see BENCHMARKS.md).

python bench/run_all.py --google-bert /path/to/google-research/bert --peer-python /path/to/tf-venv/bin/python
make bench GOOGLE_BERT=/path/to/bert PEER_PYTHON=/path/to/tf-venv/bin/python
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import bench_clean  # noqa: E402
import bench_dvc_noop  # noqa: E402
import bench_examples  # noqa: E402
import bench_scaling  # noqa: E402
import measure  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--google-bert", required=True)
    p.add_argument("--peer-python", default=sys.executable)
    p.add_argument(
        "--sources",
        nargs="+",
        default=["enwiki10", "enwiki50"],
        help="examples bench corpora (enwikiN = N MB; the peer takes ~8 s per MB)",
    )
    p.add_argument("--clean-source", default="enwiki50", help="clean bench corpus (1 process vs all cores)")
    p.add_argument("--scaling-source", default="wikitext")
    p.add_argument("--out", type=Path, default=BENCH / "out")
    args = p.parse_args()
    print(f"{datetime.date.today()} on {measure.machine()}\n")
    results: dict = {"examples": {}}
    for source in args.sources:
        results["examples"][source] = bench_examples.main(
            [
                "--google-bert",
                args.google_bert,
                "--peer-python",
                args.peer_python,
                "--source",
                source,
                "--json",
                str(args.out / f"examples-{source}.json"),
            ]
        )
        print()
    results["clean"] = bench_clean.main(["--source", args.clean_source, "--json", str(args.out / "clean.json")])
    print()
    results["scaling"] = bench_scaling.main(["--source", args.scaling_source, "--json", str(args.out / "scaling.json")])
    print()
    results["dvc_noop"] = bench_dvc_noop.main(["--json", str(args.out / "dvc_noop.json")])
    results["machine"] = measure.machine()
    results["date"] = str(datetime.date.today())
    (args.out / "all.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
