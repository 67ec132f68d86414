"""`bertrace scorecard record NAME [--note TEXT] [--set key=value ...]`, `... render` and `... show`.

``record`` keeps the row of the run just evaluated (``reports/scorecard.json``, written by the
evaluate stage) as ``reports/profiles/NAME.json``, with its minutes, commit and date read from the
run logs (``runs/<stage>.json``), so later runs' scorecards show it beside their own (e.g. after
``make repro PROFILE=wikitext2``: ``... record wikitext2``). ``--set`` fills fields measured
elsewhere, e.g. ``--set imdb_test=86.9``.

``render`` (the DVC stage ``scorecard``) writes ``reports/scorecard.md`` from the evaluated run's
row, the recorded rows and ``reports/references.yaml`` (anchors, published numbers, goals), e.g.
after copying in a row recorded in another checkout, without evaluating again; this run's minutes,
commit and date are left out of it (a rebuild of the same weights writes the same bytes) and go to
the untracked ``runs/scorecard.md`` beside this run's stages, which ``show`` prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from pipeline.core.errors import BertraceError
from pipeline.core.io import read_json, write_json
from pipeline.reports.scorecard import (
    PROFILES_DIR,
    ROW_KEYS,
    RUNS_SCORECARD_MD,
    SCORECARD_JSON,
    SCORECARD_MD,
    read_profiles,
    read_references,
    read_variants,
    run_logs,
    timed_row,
    with_variants,
)
from pipeline.reports.scorecard_md import write_scorecard


def record(name: str, note: str | None = None, sets: list[str] = ()) -> Path:
    if not SCORECARD_JSON.exists():
        raise BertraceError(f"{SCORECARD_JSON}: not found; run the pipeline (dvc repro) first")
    row = read_json(SCORECARD_JSON).get("this_run")
    if not row:
        raise BertraceError(
            f"{SCORECARD_JSON}: the last evaluate run made no row of its own; run the whole pipeline (dvc repro) first"
        )
    row = {**row, "name": name}
    names = declared_variants()
    if variants := read_variants(names=names):  # the finetune_variant stages' table travels with the row
        row = with_variants(row, variants)
    row = timed_row(row, run_logs(variants if names is None else names))  # a recorded row keeps its minutes
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


def render() -> list[dict]:
    """Rewrite the scorecard from ``reports/scorecard.json``'s own row (if any) and ``reports/profiles``,
    and ``runs/scorecard.md`` with this run's minutes from the run logs."""
    row = read_json(SCORECARD_JSON).get("this_run") if SCORECARD_JSON.exists() else None
    if row is None and not read_profiles(PROFILES_DIR):
        raise BertraceError(
            f"no rows: {SCORECARD_JSON} has no run of its own and {PROFILES_DIR}/ records none; "
            "run the pipeline (dvc repro) or record a row first"
        )
    names = declared_variants()
    variants = read_variants(names=names) if row else None
    return write_scorecard(
        row,
        references=read_references(),
        task=(row or {}).get("task"),
        variants=variants,
        logs=run_logs(names if names is not None else variants or ()),
    )


def show() -> str:
    """``runs/scorecard.md``: the scorecard with this run's minutes, commit and date."""
    if not RUNS_SCORECARD_MD.exists():
        raise BertraceError(
            f"{RUNS_SCORECARD_MD}: not found; draw it with `bertrace scorecard render` (or `dvc repro scorecard`)"
        )
    return RUNS_SCORECARD_MD.read_text(encoding="utf-8")


def declared_variants() -> list[str] | None:
    """The keys of params.yaml ``finetune_variants`` (None without params.yaml or the section)."""
    path = Path("params.yaml")
    if not path.exists():
        return None
    variants = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("finetune_variants")
    return list(variants) if isinstance(variants, dict) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bertrace scorecard", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="keep the last run's row as reports/profiles/NAME.json")
    rec.add_argument("name")
    rec.add_argument("--note")
    rec.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sub.add_parser(
        "render",
        help="write reports/scorecard.md from the evaluated run, the recorded rows and reports/references.yaml "
        "(and runs/scorecard.md: the same with this run's minutes)",
    )
    sub.add_parser("show", help="print runs/scorecard.md: the scorecard with this run's minutes, commit and date")
    args = ap.parse_args(argv)
    try:
        if args.command == "render":
            rows = render()
            names = ", ".join(r["name"] for r in rows)
            print(f"wrote {SCORECARD_MD}: {len(rows)} row{'s' if len(rows) != 1 else ''} ({names})")
            print(f"wrote {RUNS_SCORECARD_MD}: the same with this run's minutes, commit and date (untracked)")
            return 0
        if args.command == "show":
            print(show(), end="")
            return 0
        path = record(args.name, args.note, args.set)
    except BertraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"recorded {path}; `dvc repro scorecard` (or `bertrace scorecard render`) shows it in {SCORECARD_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
