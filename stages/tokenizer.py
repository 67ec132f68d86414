"""DVC stage `tokenizer`: WordPiece trained on the train split → data/tokenizer/{tokenizer.json,vocab.txt}."""

from pathlib import Path

from pipeline.tokenizer import TokenizerConfig, tokenizer_stats, train_wordpiece
from stages.common import StageRun, load_params, run_stage

CLEAN = Path("data/clean")
OUT = Path("data/tokenizer")


def main() -> None:
    params = load_params("tokenizer")
    cfg = TokenizerConfig.from_params(params)
    with StageRun("tokenizer", params) as run:
        run.add_input(CLEAN / "train.txt")
        run.add_input(CLEAN / "valid.txt")
        run.add_upstream("clean")
        info = train_wordpiece(
            CLEAN / "train.txt",
            OUT,
            vocab_size=cfg.vocab_size,
            lowercase=cfg.lowercase,
            min_frequency=cfg.min_frequency,
            limit_alphabet=cfg.limit_alphabet,
        )
        stats = tokenizer_stats(OUT / "tokenizer.json", CLEAN / "valid.txt")
        run.add_output(OUT / "tokenizer.json", info["tokenizer_sha256"])
        run.add_output(OUT / "vocab.txt", info["vocab_sha256"])
        run.set_tags({"bertrace.tokenizer_sha256": info["tokenizer_sha256"]})
        run.write_metrics({**stats, "vocab_size": info["vocab_size"]})
        run.log_artifact(OUT / "vocab.txt")
        run.write_provenance()
        print(f"tokenizer: vocab {info['vocab_size']}, valid UNK rate {stats['unk_rate']:.4%}, "
              f"{stats['tokens_per_word']:.3f} tokens/word")


if __name__ == "__main__":
    run_stage(main)
