"""`python -m stages.scorecard record NAME [--note TEXT] [--set key=value ...]`.

Keeps the row of the run just evaluated (``reports/scorecard.json``, written by the evaluate
stage) as ``reports/profiles/NAME.json``, so later runs' scorecards show it beside their own
(e.g. after ``make repro PROFILE=imdb-indomain``: ``... record imdb-indomain``). ``--set``
fills fields measured elsewhere, e.g. ``--set imdb_test=86.9``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from pipeline.errors import BertraceError
from pipeline.io import read_json, write_json
from pipeline.scorecard import PROFILES_DIR, SCORECARD_JSON, ROW_KEYS


def record(name: str, note: str | None = None, sets: list[str] = ()) -> Path:
    if not SCORECARD_JSON.exists():
        raise BertraceError(f"{SCORECARD_JSON}: not found; run the pipeline (dvc repro) first")
    row = read_json(SCORECARD_JSON).get("this_run")
    if not row:
        raise BertraceError(f"{SCORECARD_JSON}: the last evaluate run made no row of its own; run the whole "
                            "pipeline (dvc repro) first")
    row = {**row, "name": name}
    if note:
        row["note"] = note
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or key not in ROW_KEYS:
            raise BertraceError(f"--set {item!r}: use key=value with a key from {list(ROW_KEYS)}")
        row[key] = yaml.safe_load(value)
    path = PROFILES_DIR / f"{name}.json"
    write_json(path, row)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.scorecard", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="keep the last run's row as reports/profiles/NAME.json")
    rec.add_argument("name")
    rec.add_argument("--note")
    rec.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    try:
        path = record(args.name, args.note, args.set)
    except BertraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"recorded {path}; `dvc repro evaluate` shows it in reports/scorecard.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
