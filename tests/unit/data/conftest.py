"""Test helpers shared by several test modules."""

from __future__ import annotations

import json
import random
from pathlib import Path
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.data.examples import ExamplesConfig, generate_examples, truncate_pair, truncation_amounts
from pipeline.core.formats import SPECIAL_IDS
from pipeline.data.sentences import split_sentences
from pipeline.data.shards import document_order, id_dtype, partition_sizes


def _make_docs(rng: random.Random, n_docs: int, used: set[str]) -> list[list[str]]:
    """Documents as lists of sentences; each document draws from its own 25 words."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    docs = []
    for _ in range(n_docs):
        words = []
        while len(words) < 25:
            w = "".join(rng.choice(letters) for _ in range(rng.randint(5, 7)))
            if w not in used:
                used.add(w)
                words.append(w)
        sentences = [
            " ".join(rng.choice(words) for _ in range(rng.randint(3, 10))) + "." for _ in range(rng.randint(12, 40))
        ]
        docs.append(sentences)
    return docs

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(7)
    used: set[str] = set()
    train_docs, valid_docs = _make_docs(rng, 60, used), _make_docs(rng, 6, used)
    train, valid = root / "train.txt", root / "valid.txt"
    train.write_text("".join(" ".join(d) + "\n" for d in train_docs), encoding="utf-8")
    valid.write_text("".join(" ".join(d) + "\n" for d in valid_docs), encoding="utf-8")

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=8000,
        min_frequency=0,
        show_progress=False,
        special_tokens=list(SPECIAL_IDS),
        continuing_subword_prefix="##",
    )
    tok.train([str(train), str(valid)], trainer)
    tokenizer = root / "tokenizer.json"
    tok.save(str(tokenizer))

    # token id -> document index (train docs 0.., valid docs 1000..); -1 for shared tokens
    doc_of = np.full(tok.get_vocab_size(), -1, dtype=np.int64)
    for d, sentences in [*enumerate(train_docs), *((1000 + i, s) for i, s in enumerate(valid_docs))]:
        for word in {w for s in sentences for w in s.rstrip(".").split()}:
            ids = tok.encode(word, add_special_tokens=False).ids
            assert len(ids) == 1, f"fixture: {word} is not a single token"
            doc_of[ids[0]] = d
    return {
        "train": train,
        "valid": valid,
        "tokenizer": tokenizer,
        "doc_of": doc_of,
        "vocab_size": tok.get_vocab_size(),
        "root": root,
    }
