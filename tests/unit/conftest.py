"""Fixtures shared by unit tests of several subpackages."""

from __future__ import annotations

import pytest

from pipeline.data.tokenizer import load_tokenizer
from pipeline.models.checkpoint import load_pretrained
from tests.conftest import shared_file
from tests.support.finetuning import make_pretrain_checkpoint, synthetic_rows, train_tokenizer, write_csv


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A tokenizer, a pre-training checkpoint and a synthetic train/validation task."""
    root = tmp_path_factory.mktemp("finetune")
    sst2_dev = shared_file("sst2", "dev.tsv").read_text(encoding="utf-8").splitlines()[1:300]
    tok_path = train_tokenizer(root / "tokenizer.json", [line.split("\t", 1)[1] for line in sst2_dev])
    ckpt_path = make_pretrain_checkpoint(root / "pretrain" / "last.pt", tok_path)
    train = write_csv(root / "train.csv", ["text", "label"], synthetic_rows(200, 1))
    valid = write_csv(root / "valid.csv", ["text", "label"], synthetic_rows(100, 2))
    task = {
        "source": "local",
        "local": {"train": str(train), "validation": str(valid)},
        "text_columns": ["text"],
        "label_column": "label",
        "label_names": ["neg", "pos"],
    }
    return {
        "root": root,
        "tokenizer_path": tok_path,
        "tokenizer": load_tokenizer(tok_path),
        "ckpt_path": ckpt_path,
        "ckpt": load_pretrained(ckpt_path),
        "task": task,
    }
