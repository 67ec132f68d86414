"""Fine-tuning probes: dev accuracy of one pre-trained checkpoint per fine-tuning variant.

The question "is the fine-tuning recipe what hides pre-training's gain?" is answered by
fine-tuning the *same* checkpoint with several recipes, and the same model from random weights
(``mode=scratch``) with each, using the code the ``finetune`` stage runs. Each variant is
``params.yaml``'s ``finetune`` section plus ``key=value`` overrides (``max_len`` and
``truncation`` too: the task data are tokenized once per distinct pair). Only the train and
validation splits are read: the test split is never used for a choice.

    python bench/probe_finetune.py --checkpoint data/pretrain/best.pt --seeds 0 \\
        --variant "" --variant lr=1e-4 --variant lr=5e-5,epochs=4 --variant mode=scratch
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probe_pretrain import parse_variant  # noqa: E402  (first: it sets params.yaml's CPU pins)

from pipeline.core.device import apply_arithmetic  # noqa: E402
from pipeline.core.errors import BertraceError  # noqa: E402
from pipeline.data.tokenizer import load_tokenizer  # noqa: E402
from pipeline.finetune.loop import FinetuneConfig, train_seed  # noqa: E402
from pipeline.finetune.results import summarize  # noqa: E402
from pipeline.finetune.task_data import load_task_data  # noqa: E402
from pipeline.models.checkpoint import check_checkpoint_tokenizer, load_pretrained, resolve_checkpoint  # noqa: E402
from stages.arithmetic import compute_config  # noqa: E402


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--checkpoint", default="data/pretrain/best.pt", help="pre-training checkpoint (best.pt, last.pt or a snapshot)"
    )
    ap.add_argument("--tokenizer", default="data/tokenizer/tokenizer.json")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--seeds", default=None, help="comma-separated fine-tuning seeds (default: finetune.seeds)")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help='finetune overrides "k=v,k=v" ("" = params.yaml as is); repeatable',
    )
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    apply_arithmetic(compute_config(args.params))  # oneDNN off, the pins checked (pipeline/core/device.py)
    base = dict(yaml.safe_load(Path(args.params).read_text())["finetune"])
    if args.seeds:
        base["seeds"] = [int(s) for s in args.seeds.split(",")]
    ckpt_path = resolve_checkpoint(args.checkpoint)
    ckpt = load_pretrained(ckpt_path)
    check_checkpoint_tokenizer(ckpt, ckpt_path, args.tokenizer)
    tokenizer = load_tokenizer(Path(args.tokenizer))
    mirror = base.get("mirror") or os.environ.get("BERTRACE_HUB_MIRROR") or None
    datasets: dict[tuple[int, str], object] = {}
    rows = []
    for text in args.variant or [""]:
        params = {**base, **parse_variant(text)}
        key = (int(params.get("max_len") or 128), str(params.get("truncation") or "head"))
        if key not in datasets:
            datasets[key] = load_task_data(
                params.get("task"),
                tokenizer,
                max_len=key[0],
                truncation=key[1],
                mirror=mirror,
                roles=("train", "validation"),
            )
        cfg = FinetuneConfig.from_params(params, source=f"--variant {text!r}")
        t0 = time.time()
        results = [
            train_seed(ckpt, datasets[key], cfg, seed, progress=False, source=str(ckpt_path)) for seed in cfg.seeds
        ]
        summary = summarize(results)
        acc = summary["validation_accuracy"]
        row = {
            "variant": text or "params.yaml",
            "seeds": summary["seeds"],
            "dev_mean": round(100 * acc["mean"], 2),
            "dev_std": round(100 * acc["std"], 2),
            "per_seed": {str(r.seed): round(100 * r.validation_accuracy, 2) for r in results},
            "best_epoch": {str(r.seed): r.best_epoch for r in results},
            # every validation check (the best one is kept): how much the choice of check adds
            "checks": {str(r.seed): [round(100 * h["validation_accuracy"], 2) for h in r.history] for r in results},
            "wall_s": round(time.time() - t0, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{'variant':<40} {'seeds':>6} {'dev acc. (%)':>16} {'wall (s)':>9}")
    for r in rows:
        print(
            f"{r['variant']:<40} {len(r['seeds']):>6} {r['dev_mean']:>9.2f} ± {r['dev_std']:<4.2f} {r['wall_s']:>9.1f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    try:
        main()
    except BertraceError as e:
        sys.exit(f"error: {e}")
