"""``bertrace trace TARGET [--json] [--verify] [--root DIR]``: the lineage of a model.

TARGET is a checkpoint (data/finetune/model.pt, data/pretrain/best.pt) or a provenance record
(data/provenance/<stage>.json). Prints the chain of stages behind it, newest first, with git
commit (``(dirty)`` when the tree had uncommitted changes), params hash and the sha256 of every
input and output. ``--verify`` recomputes those hashes for the files under ``--root`` (default:
the current directory) and marks each ``ok``, ``changed`` or ``missing``.

Exit status: 0 when nothing recorded has changed; 1 when ``--verify`` finds a file whose bytes
differ from the record (``changed``). ``missing`` (not present under ROOT, e.g. not checked out
with ``dvc checkout`` or data kept on another machine) is reported but does not fail. 2 for a
missing or unreadable TARGET (``error: ...``, via ``run_stage``).
"""

from __future__ import annotations

import argparse
import json
import sys

from pipeline import trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bertrace trace", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", help="checkpoint (.pt) or provenance record (.json)")
    parser.add_argument("--json", action="store_true", help="print the lineage (and verification) as JSON")
    parser.add_argument("--verify", action="store_true", help="recompute the recorded hashes under --root")
    parser.add_argument("--root", default=".", help="directory the recorded paths are relative to (default: .)")
    args = parser.parse_args(argv)

    lin = trace.lineage(args.target)
    verification = trace.verify(lin, args.root) if args.verify else None
    if args.json:
        out = dict(lin)
        if verification is not None:
            out["verification"] = verification
            out["summary"] = trace.summary(verification)
        print(json.dumps(out, indent=2))
    else:
        print(trace.format_tree(lin, verification))
    code = 1 if verification and any(v["status"] == trace.CHANGED for v in verification) else 0
    if code:
        print("error: recorded files have changed since the run (see 'changed' above)", file=sys.stderr)
        sys.exit(code)
    return code


if __name__ == "__main__":
    from stages.common import run_stage

    run_stage(lambda: main(sys.argv[1:]))
