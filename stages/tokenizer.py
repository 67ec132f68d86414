"""DVC stage `tokenizer`: WordPiece trained on the train split → data/tokenizer/{tokenizer.json,vocab.txt}.

Besides UNK rate and tokens per word on valid, it measures what the normaliser does to the
corpus's letters (``normalizer``: the share removed or changed, case folding aside; see
``pipeline.data.tokenizer.normalizer_report``) and warns above ``tokenizer.warn_chars_altered``:
uncased BERT's accent stripping deletes letters in scripts whose combining marks are letters.
"""

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from pipeline.core.errors import BertraceError
from pipeline.data.sampling import document_sample
from pipeline.data.tokenizer import describe_alterations, words_altered
from pipeline.data.tokenizer_training import TokenizerConfig, tokenizer_stats, train_wordpiece
from pipeline.lineage.provenance import hash_path
from stages.common import StageRun, load_params, run_stage

CLEAN = Path("data/clean")
OUT = Path("data/tokenizer")


def main() -> None:
    params = load_params("tokenizer")
    cfg = TokenizerConfig.from_params(params)
    if cfg.workers:  # the trainer's and encoder's rayon thread pool, read when first used
        os.environ["RAYON_NUM_THREADS"] = str(cfg.workers)
    workers = cfg.workers or os.cpu_count() or 1
    inputs = (CLEAN / "train.txt", CLEAN / "valid.txt")
    for path in inputs:
        if not path.exists():
            raise BertraceError(f"{path}: not found; run the clean stage first (dvc repro clean)")
    with (
        _hashing(inputs, beside=workers > 1) as digest,
        StageRun("tokenizer", {k: v for k, v in params.items() if k in cfg.recipe_keys()}) as run,
        document_sample(CLEAN / "train.txt", max_bytes=cfg.sample_bytes, seed=cfg.seed) as train,
        document_sample(CLEAN / "valid.txt", max_bytes=cfg.valid_sample_bytes(), seed=cfg.seed) as valid,
    ):
        if train["of_documents"] and not train["documents"]:
            raise BertraceError(
                f"params.yaml: tokenizer.sample_bytes={cfg.sample_bytes} is smaller than every document of "
                f"{CLEAN / 'train.txt'}; raise it (default 100000000)"
            )
        info = train_wordpiece(
            train["path"],
            OUT,
            vocab_size=cfg.vocab_size,
            lowercase=cfg.lowercase,
            strip_accents=cfg.strip_accents,
            min_frequency=cfg.min_frequency,
            limit_alphabet=cfg.limit_alphabet,
            workers=workers,
        )
        for path in inputs:
            run.add_input(path, digest(path))
        run.add_upstream("clean")
        stats = tokenizer_stats(OUT / "tokenizer.json", valid["path"])
        norm = {
            **info["normalizer"],  # letters altered: counted on train; words: on valid
            **words_altered(OUT / "tokenizer.json", valid["path"], info["normalizer"]["altered_chars"]),
        }
        run.add_fields({"sample": {split: _described(s) for split, s in (("train", train), ("valid", valid))}})
        run.add_output(OUT / "tokenizer.json", info["tokenizer_sha256"])
        run.add_output(OUT / "vocab.txt", info["vocab_sha256"])
        run.set_tags({"bertrace.tokenizer_sha256": info["tokenizer_sha256"]})
        run.add_fields({"normalizer": {"lowercase": cfg.lowercase, "strip_accents": cfg.strip_accents, **norm}})
        numbers = {
            k: norm[k] for k in ("chars_altered", "chars_removed", "chars_changed", "words_altered") if k in norm
        }
        run.write_details({**stats, "vocab_size": info["vocab_size"], "normalizer": numbers})  # no DVC metrics
        run.log_artifact(OUT / "vocab.txt")
        run.write_provenance()
        print(
            f"tokenizer: vocab {info['vocab_size']}, valid UNK rate {stats['unk_rate']:.4%}, "
            f"{stats['tokens_per_word']:.3f} tokens/word, normaliser alters {norm['chars_altered']:.2%} of letters"
        )
        if norm["chars_altered"] > cfg.warn_chars_altered:
            keep = "auto (or false)" if cfg.strip_accents is True else "false"
            print(
                f"tokenizer: warning: {describe_alterations(norm, CLEAN / 'train.txt')}; above "
                f"tokenizer.warn_chars_altered {cfg.warn_chars_altered} (tokenizer.lowercase: "
                f"{str(cfg.lowercase).lower()}, strip_accents: {str(cfg.strip_accents).lower()}). To keep those "
                f"characters set tokenizer.strip_accents: {keep}, or lowercase: false (cased); the validate stage "
                "fails above validate.max_chars_altered",
                file=sys.stderr,
            )


@contextmanager
def _hashing(paths: tuple[Path, ...], *, beside: bool) -> Iterator[Callable[[Path], str | None]]:
    """``digest(path)``: its sha256 hashed by a second worker from the start (``beside``: while the
    stage samples and counts), else None (``StageRun.add_input`` then hashes it when asked)."""
    with ThreadPoolExecutor(1) as pool:
        futures = {path: pool.submit(hash_path, path) for path in paths} if beside else {}
        yield lambda path: futures[path].result() if futures else None


def _described(sample: dict) -> dict:
    """A sample's record fields (its temporary path left out: the record holds no host paths)."""
    return {k: v for k, v in sample.items() if k != "path"}


if __name__ == "__main__":
    run_stage(main)
