"""WordPiece ids of many sentences, fast and exactly as ``Tokenizer.encode`` gives them.

BERT's normalizer works character by character and its pre-tokenizer always splits at a
space, so the ids of a sentence are the ids of its space-separated chunks, concatenated:
``ids("The cat, sat.") == ids("The") + ids("cat,") + ids("sat.")``. Natural text repeats
its chunks (Zipf), so :class:`SentenceEncoder` splits and factorises the chunks in Arrow,
tokenizes each *distinct* chunk once and assembles sentences with numpy gathers. Distinct chunks that are printable ASCII go through
a Python copy of the WordPiece algorithm (Google's ``tokenization.WordpieceTokenizer``:
greedy longest-match-first with ``##`` continuations, ``[UNK]`` for a word that cannot be
covered or is longer than ``max_input_chars_per_word``); the others through the tokenizer
itself. Tests compare every path with ``Tokenizer.encode`` on the same text.

The normaliser may also be the script-aware form of ``tokenizer.strip_accents: auto`` (a
``Sequence`` of ``BertNormalizer``, ``NFD``, a ``Replace`` deleting characters of a class
with no ASCII in it, ``NFC``): every step works character by character and leaves printable
ASCII as ``BertNormalizer`` does. A tokenizer that is not BERT's normalizer + pre-tokenizer
(or that pads, truncates or has an added token containing a space) is used directly, one
sentence at a time in a batch.
The chunk cache is per process and capped (``max_cache`` distinct chunks), so memory stays
flat on any corpus; it changes speed only, never the ids.
"""

from __future__ import annotations

import json
import re
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# BERT's pre-tokenizer on printable ASCII: runs of letters/digits, every punctuation mark alone.
_ASCII_WORDS = re.compile(r"[0-9A-Za-z]+|[!-/:-@\[-`{-~]")


class _ChunkIndex(dict):
    """chunk → row of the piece table; a new chunk gets the next row and is queued."""

    def __init__(self):
        super().__init__()
        self.new: list[str] = []

    def __missing__(self, chunk: str) -> int:
        row = self[chunk] = len(self)
        self.new.append(chunk)
        return row


class SentenceEncoder:
    """``encode(sentences) -> (ids, lengths)``: flat ids of all sentences and each one's length."""

    def __init__(self, tok, id_dtype, *, max_cache: int = 1 << 19):
        self.tok, self.id_dtype, self.max_cache = tok, id_dtype, max_cache
        spec = json.loads(tok.to_str())
        norm, pre, model = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}, spec.get("model") or {}
        added = [a["content"] for a in spec.get("added_tokens") or []]
        bert_norm = bert_normalizer(norm)
        self.chunked = (
            pre.get("type") == "BertPreTokenizer"
            and (bert_norm is not None or not norm)
            and spec.get("truncation") is None
            and spec.get("padding") is None
            and not any(" " in a or not a for a in added)
        )
        # The Python WordPiece path: printable ASCII needs nothing from BertNormalizer but lowercasing.
        self.python_wordpiece = self.chunked and model.get("type") == "WordPiece" and bert_norm is not None
        if self.python_wordpiece:
            self.lowercase = bool(bert_norm.get("lowercase", True))
            self.vocab = tok.get_vocab(with_added_tokens=False)
            self.prefix = model.get("continuing_subword_prefix", "##")
            self.max_chars = int(model.get("max_input_chars_per_word", 100))
            self.unk_id = tok.token_to_id(model.get("unk_token", "[UNK]"))
            self.python_wordpiece = self.unk_id is not None
        self._added = re.compile("|".join(map(re.escape, added))) if added else None
        self._reset()

    def _reset(self):
        self.index = _ChunkIndex()
        self.piece_ids = np.zeros(0, dtype=self.id_dtype)  # pieces of chunk r: piece_ids[start[r]:start[r] + count[r]]
        self.piece_start = np.zeros(0, dtype=np.int64)
        self.piece_count = np.zeros(0, dtype=np.int64)

    # ------------------------------------------------------------------ public

    def encode(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not sentences:
            return np.zeros(0, dtype=self.id_dtype), np.zeros(0, dtype=np.int64)
        if not self.chunked:
            return self._encode_direct(sentences)
        if len(self.index) > self.max_cache:
            self._reset()
        # Split and factorise all chunks in Arrow (C++); Python looks up each distinct chunk once.
        parts = pc.split_pattern(pa.array(sentences, pa.large_string()), " ")
        n_chunks = pc.list_value_length(parts).to_numpy().astype(np.int64)
        distinct = pc.dictionary_encode(pc.list_flatten(parts))
        chunks = distinct.dictionary.to_pylist()
        rows = np.fromiter(map(self.index.__getitem__, chunks), dtype=np.int64, count=len(chunks))
        rows = rows[distinct.indices.to_numpy()]
        self._add_chunks()
        counts = self.piece_count[rows]
        ids = _gather_runs(self.piece_ids, self.piece_start[rows], counts)
        # tokens before each chunk boundary; a sentence spans the chunks between two boundaries
        cum = np.concatenate([[0], np.cumsum(counts)])
        chunk_end = np.cumsum(n_chunks)
        lengths = cum[chunk_end] - cum[chunk_end - n_chunks]
        return ids, lengths

    # ------------------------------------------------------------------ internals

    def _encode_direct(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets we do not need
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        ids = [e.ids for e in encode(texts, add_special_tokens=False)]
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        return np.fromiter(chain.from_iterable(ids), dtype=self.id_dtype, count=int(lengths.sum())), lengths

    def _add_chunks(self):
        new, self.index.new = self.index.new, []
        if not new:
            return
        pieces: list[list[int] | None] = [None] * len(new)
        slow: list[int] = []
        # Added tokens ("[MASK]" ...) are matched before normalization: leave chunks holding one to the tokenizer.
        check_added = self._added is not None and self._added.search("\n".join(new)) is not None
        for i, chunk in enumerate(new):
            if (
                self.python_wordpiece
                and chunk.isascii()
                and chunk.isprintable()
                and not (check_added and self._added.search(chunk))
            ):
                pieces[i] = self._ascii_pieces(chunk)
            else:
                slow.append(i)
        if slow:
            ids, lengths = self._encode_direct([new[i] for i in slow])
            for i, piece in zip(slow, np.split(ids, np.cumsum(lengths)[:-1])):
                pieces[i] = piece.tolist()
        counts = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        flat = np.fromiter(chain.from_iterable(pieces), dtype=self.id_dtype, count=int(counts.sum()))
        self.piece_start = np.concatenate([self.piece_start, len(self.piece_ids) + np.cumsum(counts) - counts])
        self.piece_count = np.concatenate([self.piece_count, counts])
        self.piece_ids = np.concatenate([self.piece_ids, flat])

    def _ascii_pieces(self, chunk: str) -> list[int]:
        """Google's WordpieceTokenizer on BERT's pre-tokens of a printable-ASCII chunk."""
        vocab, out = self.vocab, []
        text = chunk.lower() if self.lowercase else chunk
        if text.isalnum() and len(text) <= self.max_chars and text in vocab:  # one whole word: the common case
            return [vocab[text]]
        for word in _ASCII_WORDS.findall(text):
            hit = vocab.get(word)
            if hit is not None and len(word) <= self.max_chars:
                out.append(hit)
                continue
            if len(word) > self.max_chars:
                out.append(self.unk_id)
                continue
            sub, start = [], 0
            while start < len(word):
                end = len(word)
                while start < end:
                    piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                    hit = vocab.get(piece)
                    if hit is not None:
                        break
                    end -= 1
                if hit is None:
                    sub = [self.unk_id]
                    break
                sub.append(hit)
                start = end
            out.extend(sub)
        return out


_ASCII_PRINTABLE = "".join(map(chr, range(0x20, 0x7F)))


def bert_normalizer(norm: dict) -> dict | None:
    """The ``BertNormalizer`` spec of a tokenizer.json normaliser that works character by character
    and treats printable ASCII as that ``BertNormalizer`` alone does: the ``BertNormalizer``
    itself, or a ``Sequence`` of one with ``NFD`` / ``NFC`` and ``Replace`` steps that delete
    characters of a non-ASCII class (``tokenizer.strip_accents: auto``); None for anything else."""
    if not norm:
        return None
    if norm.get("type") == "BertNormalizer":
        return norm
    if norm.get("type") != "Sequence":
        return None
    parts = norm.get("normalizers") or []
    berts = [p for p in parts if p.get("type") == "BertNormalizer"]
    if len(berts) != 1 or parts[0] is not berts[0]:
        return None
    for p in parts[1:]:
        if p.get("type") in ("NFD", "NFC"):
            continue
        pattern = (p.get("pattern") or {}).get("Regex") if p.get("type") == "Replace" else None
        if pattern is None or p.get("content") != "" or not re.fullmatch(r"\[[^\[\]]*\]", pattern):
            return None
        try:
            if re.search(pattern, _ASCII_PRINTABLE) or re.search(pattern, " \t\n"):
                return None
        except re.error:
            return None
    return berts[0]


def _gather_runs(values: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([values[s:s + c] for s, c in zip(starts, counts)])`` without a loop."""
    total = int(counts.sum())
    if total == 0:
        return values[:0].copy()
    dst = np.cumsum(counts) - counts
    return values[np.repeat(starts - dst, counts) + np.arange(total)]
