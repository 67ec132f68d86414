"""Tokenizer stage: a BERT WordPiece vocabulary trained on the clean train split, with
Hugging Face ``tokenizers``' ``WordPieceTrainer`` over the pipeline of :mod:`pipeline.data.tokenizer`
(Google's ``tokenization.py``: BasicTokenizer + greedy longest-match-first WordPiece)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Callable, ClassVar, Iterable, Iterator, Literal, TypeVar

from pydantic import Field

from pipeline.core.config import Bool, Float, Int, Section
from pipeline.core.errors import BertraceError
from pipeline.core.formats import SPECIAL_TOKENS, UNK_ID
from pipeline.core.io import atomic_open, sha256_file
from pipeline.data.tokenizer import (
    StripAccents,
    build_tokenizer,
    char_counts,
    check_special_ids,
    line_batches,
    load_tokenizer,
    normalizer_report,
)

log = logging.getLogger("bertrace.tokenizer")
T, R = TypeVar("T"), TypeVar("R")

_PIECE_CHARS = 1 << 13  # the trainer gets documents cut into pieces of about this size (see _pieces)


class TokenizerConfig(Section):
    """The ``tokenizer`` section of params.yaml (defaults equal params.yaml; tests/unit/core/test_config.py)."""

    SECTION: ClassVar[str] = "tokenizer"

    vocab_size: Annotated[Int, Field(gt=5)] = 16000  # WordPiece vocabulary, special tokens included
    lowercase: Bool = True  # BERT "uncased"
    strip_accents: Literal["auto"] | Bool = "auto"  # auto: Latin/Greek/Cyrillic accents when lowercasing
    min_frequency: Annotated[Int, Field(ge=1)] = 2
    limit_alphabet: Annotated[Int, Field(ge=1)] = 1000
    warn_chars_altered: Annotated[Float, Field(ge=0, le=1)] = 0.01  # warn when the normaliser alters more letters
    sample_bytes: Annotated[Int, Field(ge=1)] = 100_000_000  # train on a seeded sample of documents this large
    seed: Int = 0  # keys the sample
    workers: Annotated[Int, Field(ge=0)] = 0  # trainer threads; 0 = all cores (never changes the bytes)

    @classmethod
    def recipe_keys(cls) -> tuple[str, ...]:
        """The keys that determine the output bytes (dvc.yaml tracks exactly these)."""
        return tuple(k for k in cls.model_fields if k != "workers")

    def valid_sample_bytes(self) -> int:
        """The valid split's measurements (UNK rate, words altered) read a sample a tenth the size."""
        return max(1, self.sample_bytes // 10)


def _pieces(batches: Iterator[list[str]], max_chars: int = _PIECE_CHARS) -> Iterator[list[str]]:
    """The batches with every text longer than ``max_chars`` cut at spaces into pieces of at most
    ``max_chars`` (a run without a space stays whole).

    Cutting at a space changes no word: BertNormalizer works character by character and
    BertPreTokenizer splits at every space (the same fact :func:`continuation_pieces` and
    ``pipeline.data.encode`` rely on), so the trainer counts the same words and the tokenizer is
    byte-identical (tested). What it bounds: ``train_from_iterator`` buffers 256 texts and
    normalises each with per-byte alignments, so its memory followed the longest documents
    (+18 MB at 16x WikiText before this)."""
    for batch in batches:
        out = []
        for line in batch:
            start = 0
            while len(line) - start > max_chars:
                cut = line.rfind(" ", start + 1, start + max_chars + 1)
                if cut < 0:
                    cut = line.find(" ", start + max_chars + 1)
                    if cut < 0:
                        break
                out.append(line[start:cut])
                start = cut + 1
            out.append(line[start:])
        yield out


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


def train_wordpiece(
    train_txt: Path,
    out_dir: Path,
    *,
    vocab_size: int,
    lowercase: bool,
    min_frequency: int,
    limit_alphabet: int = 1000,
    strip_accents: StripAccents = "auto",
    progress: bool = True,
    workers: int = 1,
) -> dict:
    """Train WordPiece on ``train_txt`` (one document per line) and write ``out_dir/tokenizer.json``
    and ``out_dir/vocab.txt`` (BERT format: one token per line, line number = id).

    Returns ``{tokenizer_sha256, vocab_sha256, vocab_size, normalizer}``; ``vocab_size`` is the
    actual size, which is smaller than requested when the corpus has fewer distinct pieces;
    ``normalizer`` is :func:`normalizer_report` on ``train_txt`` (what normalisation alters).
    ``workers``: threads for the passes before training (the trainer's own are ``RAYON_NUM_THREADS``).

    ``tokenizers``' WordPieceTrainer (BPE merges, then a WordPiece vocabulary) is not deterministic
    on its own (huggingface/tokenizers#1794): the ``##x`` tokens get ids in hash-map order, those ids
    break ties between equally frequent merges, and ``limit_alphabet`` cuts ties in hash order too.
    We make every id deterministic without changing the algorithm: the alphabet is chosen here
    (count, then code point) and passed as ``initial_alphabet``, and the ``##x`` tokens are
    registered up front, in code-point order, after a first pass that finds which ones the trainer
    creates. Same input → byte-identical tokenizer.json.
    """
    from tokenizers import models

    train_txt, out_dir = Path(train_txt), Path(out_dir)
    if not train_txt.exists():
        raise BertraceError(f"{train_txt}: not found; run the clean stage first (dvc repro clean)")
    n_lines = _count_lines(train_txt)
    if n_lines == 0:
        raise BertraceError(
            f"{train_txt}: empty; the clean stage kept no training documents "
            "(lower clean.min_chars or check the download stage)"
        )
    if vocab_size <= len(SPECIAL_TOKENS):
        raise BertraceError(f"params.yaml: tokenizer.vocab_size={vocab_size} is too small; use e.g. 16000 or 30522")

    counts = char_counts(train_txt)
    alphabet = corpus_alphabet(
        train_txt, lowercase=lowercase, limit=limit_alphabet, strip_accents=strip_accents, counts=counts
    )
    continuation = continuation_pieces(
        train_txt, lowercase=lowercase, alphabet=alphabet, strip_accents=strip_accents, counts=counts, workers=workers
    )
    trained = _train(
        _pieces(line_batches(train_txt)),
        None,
        lowercase,
        vocab_size,
        min_frequency,
        alphabet,
        continuation,
        progress,
        strip_accents,
    )

    vocab = trained.get_vocab(with_added_tokens=False)
    late = [t for t, i in vocab.items() if t.startswith("##") and len(t) == 3 and t not in continuation]
    if len(late) > 1:  # cannot happen while pass 1 sees what pass 2 sees; ids would then depend on hash order
        log.warning(
            "%s: continuation pieces %s were not pinned; the vocabulary may differ between runs", train_txt, late[:10]
        )
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise BertraceError(f"{train_txt}: the trained vocabulary has gaps in its ids; rerun the tokenizer stage")
    # The "##x" pieces were registered as special tokens only to pin their ids: rebuild the
    # tokenizer from the trained vocabulary with just the five real special tokens.
    tok = build_tokenizer(lowercase=lowercase, strip_accents=strip_accents)
    tok.model = models.WordPiece(
        vocab=dict(by_id), unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100
    )
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    check_special_ids(tok, train_txt)

    tokenizer_json, vocab_txt = out_dir / "tokenizer.json", out_dir / "vocab.txt"
    with atomic_open(tokenizer_json) as f:
        f.write(tok.to_str(pretty=True))
    with atomic_open(vocab_txt) as f:
        f.write("".join(t + "\n" for t, _ in by_id))
    return {
        "tokenizer_sha256": sha256_file(tokenizer_json),
        "vocab_sha256": sha256_file(vocab_txt),
        "vocab_size": len(by_id),
        "normalizer": normalizer_report(tok, train_txt, counts=counts),
    }


def _train(
    batches: Iterator[list[str]],
    n_sequences: int | None,
    lowercase: bool,
    vocab_size: int,
    min_frequency: int,
    alphabet: list[str],
    continuation: list[str],
    progress: bool,
    strip_accents: StripAccents = None,
):
    """WordPieceTrainer over ``batches`` (lists of texts); ``n_sequences`` (texts, not batches, as
    ``train_from_iterator``'s ``length`` counts them) only drives the progress bar."""
    from tokenizers import trainers

    tok = build_tokenizer(lowercase=lowercase, strip_accents=strip_accents)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS) + continuation,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),  # keeps exactly `alphabet`: its entries count as infinitely frequent
        continuing_subword_prefix="##",
        show_progress=progress,
    )
    tok.train_from_iterator(batches, trainer=trainer, length=n_sequences)
    return tok


def continuation_pieces(
    train_txt: Path,
    *,
    lowercase: bool,
    alphabet: list[str],
    strip_accents: StripAccents = None,
    counts=None,
    workers: int = 1,
) -> list[str]:
    """The ``##x`` pieces the trainer creates (``x`` in ``alphabet`` seen inside a word), sorted.

    The trainer makes ``##x`` for every character ``x`` of ``alphabet`` that follows another
    character of the same pre-tokenised word. Normalisation works character by character, so each
    distinct character (``counts``: :func:`char_counts` of ``train_txt``) is normalised once (as
    :func:`corpus_alphabet` does) and the text is read as pairs of neighbouring kept characters
    (numpy): ``x`` continues a word when it and the kept character before it are word characters,
    i.e. neither a space nor a character the pre-tokeniser splits off (tested against a no-merge
    training pass on Unicode stress text). ``workers`` threads read the batches (numpy's gathers
    release the GIL); the result does not depend on their number.
    """
    import numpy as np

    tok = build_tokenizer(lowercase=lowercase, strip_accents=strip_accents)
    if counts is None:
        counts = char_counts(train_txt)
    in_word: dict[str, bool] = {}

    def word_char(ch: str) -> bool:  # the pre-tokeniser's own verdict: "a" + ch + "a" stays one word
        if ch not in in_word:
            in_word[ch] = len(tok.pre_tokenizer.pre_tokenize_str("a" + ch + "a")) == 1
        return in_word[ch]

    kept = np.zeros(0x110000, bool)  # normalises to something
    starts, ends = np.zeros(0x110000, bool), np.zeros(0x110000, bool)  # its first / last char is a word char
    first = np.zeros(0x110000, np.int32)  # the first char it normalises to
    found: set[str] = set()
    for cp in sorted({10, *np.flatnonzero(counts).tolist()}):  # 10: the line ends that join a batch
        out = tok.normalizer.normalize_str(chr(cp))
        if out:
            flags = [word_char(c) for c in out]
            kept[cp], starts[cp], ends[cp], first[cp] = True, flags[0], flags[-1], ord(out[0])
            found.update(out[j] for j in range(1, len(out)) if flags[j - 1] and flags[j])

    def continued(batch: list[str]) -> list[int]:
        """The first characters of the kept characters that continue a word in ``batch``."""
        cps = np.frombuffer("\n".join(batch).encode("utf-32-le"), dtype=np.uint32)
        chars = cps[kept[cps]]
        hit = np.zeros(0x110000, bool)
        hit[first[chars[1:][ends[chars[:-1]] & starts[chars[1:]]]]] = True
        return np.flatnonzero(hit).tolist()

    for cps in thread_map(continued, line_batches(Path(train_txt)), workers):
        found.update(map(chr, cps))
    allowed = set(alphabet)
    return sorted("##" + c for c in found if c in allowed)


def thread_map(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """``map(fn, items)`` on ``workers`` threads, in order, with at most ``2 * workers`` items in
    flight (memory stays bounded however long ``items`` is); ``workers <= 1`` runs in this thread."""
    if workers <= 1:
        yield from map(fn, items)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def corpus_alphabet(
    train_txt: Path, *, lowercase: bool, limit: int | None, strip_accents: StripAccents = None, counts=None
) -> list[str]:
    """The ``limit`` most frequent characters of the normalised text (ties: lower code point
    first), in code-point order; all characters when ``limit`` is None.

    Counts raw code points (numpy), then maps each distinct character through the BERT
    normaliser: it works character by character (control removal, CJK spacing, NFD accent
    stripping, lowercasing), so the counts equal those of the normalised text.
    """
    import numpy as np

    tok = build_tokenizer(lowercase=lowercase, strip_accents=strip_accents)
    if counts is None:
        counts = char_counts(train_txt)
    normalised: dict[str, int] = {}
    for cp in np.flatnonzero(counts):
        for ch in tok.normalizer.normalize_str(chr(int(cp))):
            if not ch.isspace():
                normalised[ch] = normalised.get(ch, 0) + int(counts[cp])
    ranked = sorted(normalised, key=lambda ch: (-normalised[ch], ord(ch)))
    if limit is not None:
        ranked = ranked[:limit]
    return sorted(ranked, key=ord)


def tokenizer_stats(tokenizer_json: Path, valid_txt: Path, max_docs: int | None = None) -> dict:
    """Share of ``[UNK]`` tokens and WordPiece tokens per whitespace word on ``valid_txt``
    (special tokens not counted)."""
    tok = load_tokenizer(tokenizer_json)
    valid_txt = Path(valid_txt)
    if not valid_txt.exists():
        raise BertraceError(f"{valid_txt}: not found; run the clean stage first (dvc repro clean)")
    docs = tokens = unks = words = 0
    for batch in line_batches(valid_txt):
        if max_docs is not None:
            batch = batch[: max(0, max_docs - docs)]
            if not batch:
                break
        for enc in tok.encode_batch(batch, add_special_tokens=False):
            tokens += len(enc.ids)
            unks += enc.ids.count(UNK_ID)
        words += sum(len(line.split()) for line in batch)
        docs += len(batch)
    return {
        "documents": docs,
        "tokens": tokens,
        "words": words,
        "unk_rate": unks / tokens if tokens else 0.0,
        "tokens_per_word": tokens / words if words else 0.0,
    }
