"""The ``bertrace`` command: user-facing tools around the pipeline.

    bertrace validate DIR        Great Expectations checks on a shard directory (manifest.json)
    bertrace validate --corpus F Great Expectations checks on clean corpus files
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="bertrace", description="bertrace tools")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="validate a shard directory or corpus files", add_help=False)
    v.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv[:1])
    rest = argv[1:]
    if args.command == "validate":
        from stages.common import run_stage
        from stages import validate

        if rest and not rest[0].startswith("-"):
            rest = ["--shards", *rest]
        run_stage(lambda: validate.main(rest))


if __name__ == "__main__":
    main()
