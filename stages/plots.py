"""``bertrace plots [--out reports/plots.html] [--root DIR]`` (and the DVC stage ``plots``).

Writes the plots dvc.yaml declares (pre-training loss and validation curves, the confusion
matrix, the learning curve, ...) into one self-contained HTML file that opens offline: each plot
is rendered to SVG by vl-convert and inlined, where ``dvc plots show`` loads Vega from a CDN.
The learning curve (``make learning-curve``) is drawn only when it was made from the current
pre-trained checkpoint (the sha256 of ``data/pretrain/best.pt``); otherwise the page says it is stale
and why. The page holds no time: the same inputs give the same bytes. Logic: pipeline/reports/plots.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.core.errors import BertraceError
from pipeline.reports.plots import REPORT, write_plots_report


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="bertrace plots", description=__doc__.split("\n\n")[1].replace("\n", " "))
    ap.add_argument(
        "--out", type=Path, default=REPORT, help=f"HTML file to write, relative to --root (default {REPORT})"
    )
    ap.add_argument(
        "--root", type=Path, default=Path("."), help="repository whose dvc.yaml and plots/ to read (default .)"
    )
    args = ap.parse_args(argv)
    summary = write_plots_report(args.out, args.root)
    for p in summary["plots"]:
        print(f"  {p['name']}: {'drawn' if p['status'] == 'ok' else p['status']}")
        for note in p["notes"]:
            print(f"      {note}")
    drawn = sum(p["status"] == "ok" for p in summary["plots"])
    print(f"wrote {summary['path']}: {drawn} of {len(summary['plots'])} plots drawn (open it in a browser, offline)")
    return summary


def cli(argv: list[str] | None = None) -> int:
    """``main`` with a user error as one line and exit status 2 (no stages.common: the DVC stage's
    code deps stay this file and pipeline/reports/plots.py)."""
    try:
        main(argv)
    except BertraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
