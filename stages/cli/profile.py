"""`python -m stages.cli.profile NAME [--show]`: the `dvc exp run -S ...` arguments of a profile.

``make repro PROFILE=NAME`` runs ``dvc exp run`` with them: the pipeline with the profile's
params, recorded as a DVC experiment (``dvc exp show``, ``dvc params diff``). ``--show`` prints
the merged params instead.
"""

from __future__ import annotations

import argparse
import sys

import yaml

from pipeline.core.errors import BertraceError
from pipeline.reports.profiles import apply_overrides, flatten_overrides, load_profile, profile_path, shell_args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.cli.profile", description=__doc__.splitlines()[0])
    ap.add_argument("name", help="profiles/NAME.yaml (or a path to a profile file)")
    ap.add_argument("--show", action="store_true", help="print the merged params.yaml sections it changes")
    args = ap.parse_args(argv)
    try:
        params = yaml.safe_load(open("params.yaml", encoding="utf-8"))
        flat = flatten_overrides(load_profile(args.name), params, source=str(profile_path(args.name)))
        if args.show:
            merged = apply_overrides(params, flat)
            sections = sorted({k.split(".")[0] for k in flat})
            print(yaml.safe_dump({s: merged[s] for s in sections}, sort_keys=False), end="")
        else:
            print(shell_args(flat, params))
    except BertraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
