"""A tiny WordPiece tokenizer, a pre-training checkpoint and synthetic task files for fine-tuning tests."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import torch

from pipeline.core.formats import SPECIAL_TOKENS
from pipeline.core.io import sha256_file
from pipeline.data.tokenizer import build_tokenizer, load_tokenizer
from pipeline.models.bert import BertConfig, BertForPreTraining
from pipeline.models.checkpoint import save_checkpoint

FILLER = "the a movie film story plot actor scene was is very quite rather this that".split()


def synthetic_rows(n: int, seed: int) -> list[tuple[str, int]]:
    """A trivially learnable task: label 1 iff the sentence contains 'good' (else 'bad')."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % 2
        words = rng.choices(FILLER, k=rng.randint(4, 10))
        words.insert(rng.randrange(len(words) + 1), "good" if label else "bad")
        rows.append((" ".join(words), label))
    rng.shuffle(rows)
    return rows


def write_csv(path: Path, header: list[str], rows: list[tuple]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def train_tokenizer(path: Path, extra_lines: list[str], vocab_size: int = 400) -> Path:
    from tokenizers import trainers

    tok = build_tokenizer(lowercase=True)
    corpus = [t for t, _ in synthetic_rows(200, 0)] + extra_lines
    tok.train_from_iterator(
        corpus,
        trainer=trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            continuing_subword_prefix="##",
            show_progress=False,
        ),
    )
    path.write_text(tok.to_str(), encoding="utf-8")
    return path


def tiny_config(vocab_size: int) -> BertConfig:
    return BertConfig(
        vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position=128
    )


def make_pretrain_checkpoint(path: Path, tokenizer_path: Path, seed: int = 1234) -> Path:
    """A pre-training checkpoint in the SPEC format with random BertForPreTraining weights (a seed no
    fine-tuning test uses: a scratch model with the same seed would equal it)."""
    tok = load_tokenizer(tokenizer_path)
    torch.manual_seed(seed)
    config = tiny_config(tok.get_vocab_size())
    model = BertForPreTraining(config)
    provenance = {
        "stage": "pretrain",
        "params": {},
        "params_hash": "0" * 64,
        "tokenizer_sha256": sha256_file(tokenizer_path),
        "examples_manifest_sha256": "1" * 64,
    }
    return save_checkpoint(
        path, {"model": model.state_dict(), "model_config": config.to_dict(), "step": 0, "provenance": provenance}
    )
