"""``bertrace trace TARGET [--json] [--verify] [--root DIR]``: the lineage of a model.

TARGET is a checkpoint (data/finetune/model.pt, data/pretrain/best.pt), a provenance record
(data/provenance/<stage>.json), an exported directory (`bertrace export --hf DIR`, or a
downloaded MLflow model), or an MLflow run id, runs:/<run id>/model, models:/<name>/<version>,
models:/<name>@<alias> or models:/<model id> (store: MLFLOW_TRACKING_URI, else ROOT/mlflow.db).
Prints the chain of stages behind it, newest first, with git commit (``(dirty)`` and the
uncommitted paths when the tree had changes), params hash, finish time, the sha256 of every
input and output and the dvc.lock md5s of the upstream outputs. ``--verify`` rechecks every
link under ``--root`` (default: the repository holding TARGET, else the current directory): file hashes, each input against the
upstream stage's recorded output, each stage's params.yaml section, DVC cache presence of the
recorded md5s, the checkpoint inside an export or MLflow model, and every shard listed by the
examples manifest against the sha256 recorded there (one summary line; each bad shard on its own).
Last, for the pre-training record: whether this machine would recompute its weights byte for byte
(device, precision ``auto`` resolved here, torch build, CPU threads), and if not, why.

Exit status: 0 when nothing recorded has changed; 1 when ``--verify`` finds a mismatch
(``CHANGED``, printed with both hashes). Files not present under ROOT (data/ gone, not checked
out with ``dvc checkout``, another machine) are reported as ``not present`` and do not fail.
2 for a missing or unreadable TARGET (``error: ...``, via ``run_stage``).
"""

from __future__ import annotations

import argparse
import json
import sys

from pipeline.lineage import trace, trace_render, trace_verify


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bertrace trace",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", help="checkpoint, provenance record, exported directory, MLflow run id or URI")
    parser.add_argument("--json", action="store_true", help="print the lineage (and verification) as JSON")
    parser.add_argument("--verify", action="store_true", help="recompute the recorded hashes under --root")
    parser.add_argument(
        "--root", help="directory the recorded paths are relative to (default: the repository holding TARGET, else .)"
    )
    args = parser.parse_args(argv)

    root = args.root or trace.repository_root(args.target)
    lin = trace.lineage(args.target, root)
    verification = trace_verify.verify(lin, root) if args.verify else None
    here = trace_render.this_machine(lin)
    if args.json:
        out = dict(lin)
        if verification is not None:
            out["verification"] = verification
            out["summary"] = trace_verify.summary(verification)
        out["this_machine"] = here
        print(json.dumps(out, indent=2))
    else:
        print("\n".join([trace_render.format_tree(lin, verification), *here]))
    code = 1 if verification and any(v["status"] == trace_verify.CHANGED for v in verification) else 0
    if code:
        print("error: the recorded chain does not match what is here (see CHANGED above)", file=sys.stderr)
        sys.exit(code)
    return code


if __name__ == "__main__":
    from stages.common import run_stage

    run_stage(lambda: main(sys.argv[1:]))
