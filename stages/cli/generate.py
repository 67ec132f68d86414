"""``bertrace generate``: sample a continuation from a causal-LM checkpoint (pretrain.objective: clm).

    bertrace generate "the history of"                  sampling at temperature 1, seed 0
    bertrace generate "the history of" --temperature 0  greedy (what transformers' generate gives)
    bertrace generate "in 1990 ," --top-k 40 --top-p 0.9 --seed 7 --max-new-tokens 80

The text (the prompt as the tokenizer normalises it, then the continuation) is written to stdout
as the tokens are produced; a summary line goes to stderr. Logic: pipeline/apps/generate.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pipeline.core.errors import BertraceError

PRETRAIN_DIR = Path("data/pretrain")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bertrace generate",
        description="sample text from a causal-LM checkpoint (pretrain.objective: clm), streaming it to the terminal",
    )
    p.add_argument("prompt", nargs="?", default="", help="text to continue (default: start a new document)")
    p.add_argument(
        "--checkpoint",
        "-c",
        type=Path,
        default=None,
        help=f"pre-training checkpoint (default {PRETRAIN_DIR}/best.pt, else {PRETRAIN_DIR}/last.pt)",
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="tokenizer.json (default: next to the checkpoint, else data/tokenizer/tokenizer.json)",
    )
    p.add_argument("--max-new-tokens", "-n", type=int, default=50, help="tokens to generate at most (default 50)")
    p.add_argument("--temperature", "-t", type=float, default=1.0, help="softmax temperature; 0 = greedy (default 1)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens only (0 = off)")
    p.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="nucleus sampling: the smallest set of tokens with probability mass >= p (1 = off)",
    )
    p.add_argument("--seed", type=int, default=0, help="sampling seed: the same seed gives the same text (default 0)")
    return p


def default_checkpoint(directory: Path = PRETRAIN_DIR) -> Path:
    for name in ("best.pt", "last.pt"):
        if (directory / name).is_file():
            return directory / name
    raise BertraceError(
        f"{directory}: neither best.pt nor last.pt found; run the pretrain stage with "
        "pretrain.objective: clm, or pass --checkpoint PATH"
    )


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    from pipeline.apps.generate import check_sampling, generate_text, load_causal_lm

    check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p)
    checkpoint = args.checkpoint or default_checkpoint()
    model, tokenizer, _ = load_causal_lm(checkpoint, args.tokenizer)

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    start = time.perf_counter()
    sample = generate_text(
        model,
        tokenizer,
        args.prompt,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k or None,
        top_p=args.top_p,
        seed=args.seed,
        on_text=show,
    )
    seconds = time.perf_counter() - start
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(
        f"generate: {len(sample.new_ids)} new tokens from {checkpoint} in {seconds:.2f} s "
        f"({len(sample.new_ids) / max(seconds, 1e-9):.1f} tokens/s; seed {args.seed}, "
        f"temperature {args.temperature:g})",
        file=sys.stderr,
    )


if __name__ == "__main__":
    from stages.common import run_stage

    run_stage(main)
