"""A small synthetic corpus for tokenizer tests."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = (
    "the quick brown fox jumps over lazy dog while seven wizards quietly hex jovial boxers near "
    "university library station mountain river history philosophy anarchism autism science"
).split()


def write_corpus(path: Path, n_docs: int = 300, seed: int = 0) -> Path:
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        words = [rng.choice(WORDS) for _ in range(rng.randint(20, 60))]
        words[0] = words[0].capitalize()
        docs.append(" ".join(words) + ", " + rng.choice(WORDS) + ". Café Ångström " + str(rng.randint(0, 9999)) + ".")
    path.write_text("\n".join(docs) + "\n", encoding="utf-8")
    return path
