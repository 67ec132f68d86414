"""Pre-training probes: validation MLM loss after a few minutes, per recipe variant.

On a CPU budget the recipe question is "which settings lower the masked-LM loss fastest per
minute"; this answers it with the same code the `pretrain` stage runs, on the examples of a
DAG that has been built (``data/examples``). Each variant is ``params.yaml``'s ``pretrain``
section plus ``key=value`` overrides, trained for ``--minutes`` of wall clock (the lr schedule
follows the clock, so every variant warms up and decays within its budget), then validated on
``--eval-batches`` batches. Variants run one after the other: run nothing else on the machine
meanwhile, since the budget is wall time (a wall-clock budget on purpose: the question is loss
per minute; the rows are not reproducible, unlike the default ``max_steps`` pipeline). The arithmetic is
the stages' (``compute`` in ``params.yaml``: portable pins by default).

    python bench/probe_pretrain.py --minutes 4 --variant "" --variant lr=2e-3 \\
        --variant lr=2e-3,objective=mlm --variant lr=5e-3 --variant batch_size=128,lr=3e-3 \\
        --variant model.pre_ln=true,lr=1e-3          # a dotted key sets a nested one
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stages.arithmetic import compute_config  # noqa: E402  (first: params.yaml's CPU pins, before torch loads)

# isort: split
from pipeline.core.device import apply_arithmetic  # noqa: E402
from pipeline.pretrain.config import PretrainConfig  # noqa: E402
from pipeline.pretrain.loop import pretrain  # noqa: E402


def parse_variant(text: str) -> dict:
    """``"lr=2e-3,objective=mlm"`` -> ``{"lr": 0.002, "objective": "mlm"}`` (YAML-typed values)."""
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {text!r}: write key=value pairs separated by commas")
        parsed = yaml.safe_load(value)
        if isinstance(parsed, str):  # YAML 1.1 reads "2e-3" as a string
            try:
                parsed = float(parsed)
            except ValueError:
                pass
        out[key.strip()] = parsed
    return out


def apply_overrides(base: dict, overrides: dict) -> dict:
    """``base`` with ``overrides`` laid over it; a dotted key (``model.pre_ln``) sets a nested one."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", default="data/examples", help="examples dir of a built DAG")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--eval-batches", type=int, default=40)
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help='pretrain overrides "k=v,k=v" ("" = params.yaml as is); repeatable',
    )
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    apply_arithmetic(compute_config(args.params))  # oneDNN off, the pins checked (pipeline/core/device.py)
    base = yaml.safe_load(Path(args.params).read_text())["pretrain"]
    base = {k: v for k, v in base.items() if k != "resume"}
    rows = []
    for text in args.variant or [""]:
        params = {
            **apply_overrides(base, parse_variant(text)),
            "time_minutes": args.minutes,
            "max_steps": None,
            "epochs": None,
            "eval_every": 0,
            "eval_batches": args.eval_batches,
            "checkpoint_every": 0,
            "checkpoint_minutes": 0,
            "snapshot_minutes": [],
            "snapshot_steps": [],
        }
        cfg = PretrainConfig.from_params(params)
        t0 = time.time()
        with tempfile.TemporaryDirectory() as out:
            m = pretrain(
                cfg, examples_dir=Path(args.examples), out_dir=Path(out), provenance={}, resume=False, progress=False
            )
        row = {
            "variant": text or "params.yaml",
            "minutes": args.minutes,
            "steps": m["step"],
            "tokens": m["tokens_seen"],
            "tokens_per_s": m["tokens_per_s"],
            "val_mlm_loss": round(m["val_mlm_loss"], 4),
            "val_mlm_acc": round(m["val_mlm_acc"], 4),
            "val_nsp_acc": round(m["val_nsp_acc"], 4),
            "wall_s": round(time.time() - t0, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{'variant':<36} {'steps':>7} {'tokens':>11} {'val MLM loss':>13} {'MLM acc':>8} {'NSP acc':>8}")
    for r in rows:
        print(
            f"{r['variant']:<36} {r['steps']:>7,} {r['tokens']:>11,} {r['val_mlm_loss']:>13.3f} "
            f"{r['val_mlm_acc']:>8.3f} {r['val_nsp_acc']:>8.3f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
