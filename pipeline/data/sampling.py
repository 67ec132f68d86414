"""A seeded sample of whole documents from a one-document-per-line text file, of a stated size.

The tokenizer stage trains on such a sample, so its time and memory stop growing with the corpus
(Google built BERT's WordPiece vocabulary from a sample of the pre-training text as well;
Devlin et al. 2019, footnote on the vocabulary; ``tokenization.py`` only applies it). The sample
is a function of the file's bytes, ``max_bytes`` and ``seed`` alone: documents are drawn in a
seeded random order until the next one would pass ``max_bytes``, then written in file order.
A file no larger than ``max_bytes`` is its own sample (the function returns it unchanged).
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.core.io import atomic_open

_BLOCK = 1 << 24  # bytes read at a time when finding the line ends


def line_ends(path: Path) -> np.ndarray:
    """Byte offsets just past each line's ``\\n`` (a last line without one ends at the file's end)."""
    ends: list[np.ndarray] = []
    offset = 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            ends.append(np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10) + (offset + 1))
            offset += len(block)
    out = np.concatenate(ends) if ends else np.zeros(0, np.int64)
    if offset and (not len(out) or out[-1] != offset):
        out = np.append(out, offset)
    return out.astype(np.int64)


def sample_documents(path: Path, out: Path, *, max_bytes: int, seed: int) -> dict:
    """Write a seeded sample of the lines of ``path`` totalling at most ``max_bytes`` to ``out``
    (UTF-8 bytes, newlines included; in the file's order) and describe it.

    Returns ``{path, sampled, documents, bytes, of_documents, of_bytes, seed}``; ``path`` is ``out``,
    or ``path`` itself (nothing written) when the whole file fits in ``max_bytes``.
    """
    path, out = Path(path), Path(out)
    ends = line_ends(path)
    total = int(ends[-1]) if len(ends) else 0
    info = {"of_documents": int(len(ends)), "of_bytes": total, "seed": seed}
    if total <= max_bytes:
        return {"path": path, "sampled": False, "documents": int(len(ends)), "bytes": total, **info}
    starts = np.concatenate([[0], ends[:-1]])
    order = np.random.default_rng(seed).permutation(len(ends))
    taken = int(np.searchsorted(np.cumsum(ends[order] - starts[order]), max_bytes, side="right"))
    chosen = np.sort(order[:taken])
    size = 0
    with open(path, "rb") as src, atomic_open(out, "wb") as dst:
        for i in chosen:
            src.seek(int(starts[i]))
            line = src.read(int(ends[i] - starts[i]))
            dst.write(line if line.endswith(b"\n") else line + b"\n")
            size += len(line)
    return {"path": out, "sampled": True, "documents": int(taken), "bytes": size, **info}


@contextmanager
def document_sample(path: Path, *, max_bytes: int, seed: int) -> Iterator[dict]:
    """:func:`sample_documents` into a temporary file (under ``$TMPDIR``) that lives for the
    ``with`` block; yields its description (``path`` is the file to read)."""
    with tempfile.TemporaryDirectory(prefix="bertrace-sample-") as tmp:
        yield sample_documents(path, Path(tmp) / Path(path).name, max_bytes=max_bytes, seed=seed)
