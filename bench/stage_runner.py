"""One data stage as its own process, for the benches to time: the library call the DVC stage
makes, without MLflow or provenance. Prints one JSON line with the stage's counts.

    python bench/stage_runner.py clean RAW_DIR OUT_DIR [--workers N] [--engine local|dask]
    python bench/stage_runner.py tokenizer CLEAN_DIR OUT_DIR
    python bench/stage_runner.py examples CLEAN_DIR TOKENIZER_JSON OUT_DIR [--workers N] [--engine local|dask]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=["clean", "tokenizer", "examples"])
    p.add_argument("paths", nargs="+")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--engine", default="local")
    p.add_argument("--scheduler", default="")
    p.add_argument("--docs-per-shard", type=int, default=256)
    args = p.parse_args()
    if args.stage == "clean":
        from pipeline.data.clean import clean_corpus

        raw, out = map(Path, args.paths)
        result = clean_corpus(
            raw,
            out,
            min_chars=200,
            valid_fraction=0.1,
            seed=0,
            workers=args.workers,
            engine=args.engine,
            scheduler=args.scheduler or None,
            progress=False,
        )
    elif args.stage == "tokenizer":
        from pipeline.data.tokenizer_training import train_wordpiece

        clean, out = map(Path, args.paths)
        result = train_wordpiece(
            clean / "train.txt", out, vocab_size=16000, lowercase=True, min_frequency=2, progress=False
        )
    else:
        from pipeline.data.examples import ExamplesConfig, generate_examples

        clean, tok, out = map(Path, args.paths)
        cfg = ExamplesConfig(
            max_seq_len=128,
            dupe_factor=5,
            masked_lm_prob=0.15,
            short_seq_prob=0.1,
            max_predictions_per_seq=20,
            docs_per_shard=args.docs_per_shard,
            row_group_size=512,
        )
        manifest = generate_examples(
            clean / "train.txt",
            clean / "valid.txt",
            tok,
            out,
            cfg,
            workers=args.workers,
            engine=args.engine,
            scheduler=args.scheduler or None,
            progress=False,
        )
        result = {
            split: {"rows": v["rows"], "tokens": v["tokens"], "shards": len(v["shards"])}
            for split, v in manifest["splits"].items()
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
