"""Tokenizer stage: a BERT WordPiece vocabulary trained on the clean train split.

The pipeline matches Google's BERT tokenizer (``tokenization.py``): ``BasicTokenizer`` (clean
control characters, space out CJK characters, lowercase and strip accents for "uncased", split on
whitespace and punctuation) followed by greedy longest-match-first WordPiece with the ``##``
continuation prefix. Special tokens have fixed ids so every later stage can rely on them.

Accents (``tokenizer.strip_accents``). Google's uncased ``_run_strip_accents`` deletes every
nonspacing mark after NFD. In Latin, Greek and Cyrillic those are accents (``é`` → ``e``); in
Indic, Thai, Arabic, Hebrew ... they are vowel signs, viramas, nuktas: letters (Bengali
``অক্সিজেন`` → ``অকসিজেন``). ``auto`` (the default) strips only the marks of the generic
Combining Diacritical Marks blocks (U+0300–036F, 1AB0–1AFF, 1DC0–1DFF, 20D0–20FF, FE20–FE2F:
the accents of Latin, Greek and Cyrillic), and only when lowercasing, as uncased BERT does for
those scripts; ``true`` is Google's uncased rule (every mark), ``false`` keeps every mark. The
share of letters the normaliser removes or changes (case folding aside) is measured on the
corpus (:func:`normalizer_report`): the tokenizer stage reports it and warns, the validate
stage fails above ``validate.max_chars_altered``.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from pathlib import Path
from typing import Annotated, Any, ClassVar, Iterator, Literal

from pydantic import Field

from pipeline.config import Bool, Float, Int, Section
from pipeline.errors import BertraceError
from pipeline.formats import SPECIAL_IDS, SPECIAL_TOKENS, UNK_ID  # [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4
from pipeline.io import atomic_open, sha256_file

_BATCH_LINES = 256
_BATCH_CHARS = 1 << 20  # a line is a whole document: bound batches by size too, or memory follows the corpus
_PIECE_CHARS = 1 << 13  # the trainer gets documents cut into pieces of about this size (see _pieces)
log = logging.getLogger("bertrace.tokenizer")
# The accents of Latin, Greek and Cyrillic: what strip_accents: auto removes (after NFD, when lowercasing).
COMBINING_DIACRITICS = "[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]"


class TokenizerConfig(Section):
    """The ``tokenizer`` section of params.yaml (defaults equal params.yaml; tests/test_config.py)."""

    SECTION: ClassVar[str] = "tokenizer"

    vocab_size: Annotated[Int, Field(gt=5)] = 16000  # WordPiece vocabulary, special tokens included
    lowercase: Bool = True  # BERT "uncased"
    strip_accents: Literal["auto"] | Bool = "auto"  # auto: Latin/Greek/Cyrillic accents when lowercasing
    min_frequency: Annotated[Int, Field(ge=1)] = 2
    limit_alphabet: Annotated[Int, Field(ge=1)] = 1000
    warn_chars_altered: Annotated[Float, Field(ge=0, le=1)] = 0.01  # warn when the normaliser alters more letters


StripAccents = Literal["auto"] | bool | None


def build_normalizer(*, lowercase: bool, strip_accents: StripAccents = None):
    """BERT's normaliser: ``BertNormalizer`` (clean text, CJK spacing, case, accents) for
    ``strip_accents`` true/false (None: strip iff lowercase, Google's rule), or for ``auto`` with
    lowercasing, ``BertNormalizer`` (no stripping) → NFD → delete :data:`COMBINING_DIACRITICS` → NFC
    (see the module docstring). Every step works character by character, as ``pipeline.encode``
    and :func:`_pieces` assume."""
    from tokenizers import Regex, normalizers

    if strip_accents is None:
        strip_accents = lowercase
    if strip_accents == "auto" and not lowercase:
        strip_accents = False  # cased BERT strips nothing
    if strip_accents == "auto":
        return normalizers.Sequence([
            normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=True),
            normalizers.NFD(),
            normalizers.Replace(Regex(COMBINING_DIACRITICS), ""),
            normalizers.NFC(),
        ])
    return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=bool(strip_accents),
                                      lowercase=lowercase)


def build_tokenizer(*, lowercase: bool, strip_accents: StripAccents = None):
    """An untrained BERT WordPiece tokenizer (normaliser, pre-tokeniser, template, decoder).
    ``strip_accents``: see :func:`build_normalizer` (None: Google's rule, strip iff lowercase)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = build_normalizer(lowercase=lowercase, strip_accents=strip_accents)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", SPECIAL_IDS["[CLS]"]), ("[SEP]", SPECIAL_IDS["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _line_batches(path: Path) -> Iterator[list[str]]:
    """Lines of a text file in batches of at most ``_BATCH_LINES`` lines and about ``_BATCH_CHARS``
    characters (a batch ends at the line that reaches either), so no step holds more than a batch.

    Bounding lines alone is not enough: lines are documents, and 256 Wikipedia articles are
    ~5 MB of text, ~100 MB once ``corpus_alphabet`` turns them into code points (the scaling
    bench's tokenizer peak grew 83 → 158 MB from 1x to 16x the corpus before this bound)."""
    batch: list[str] = []
    size = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            batch.append(line.rstrip("\n"))
            size += len(line)
            if len(batch) >= _BATCH_LINES or size >= _BATCH_CHARS:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _pieces(batches: Iterator[list[str]], max_chars: int = _PIECE_CHARS) -> Iterator[list[str]]:
    """The batches with every text longer than ``max_chars`` cut at spaces into pieces of at most
    ``max_chars`` (a run without a space stays whole).

    Cutting at a space changes no word: BertNormalizer works character by character and
    BertPreTokenizer splits at every space (the same fact :func:`continuation_pieces` and
    ``pipeline.encode`` rely on), so the trainer counts the same words and the tokenizer is
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


def train_wordpiece(train_txt: Path, out_dir: Path, *, vocab_size: int, lowercase: bool, min_frequency: int,
                    limit_alphabet: int = 1000, strip_accents: StripAccents = "auto", progress: bool = True) -> dict:
    """Train WordPiece on ``train_txt`` (one document per line) and write ``out_dir/tokenizer.json``
    and ``out_dir/vocab.txt`` (BERT format: one token per line, line number = id).

    Returns ``{tokenizer_sha256, vocab_sha256, vocab_size, normalizer}``; ``vocab_size`` is the
    actual size, which is smaller than requested when the corpus has fewer distinct pieces;
    ``normalizer`` is :func:`normalizer_report` on ``train_txt`` (what normalisation alters).

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
        raise BertraceError(f"{train_txt}: empty; the clean stage kept no training documents "
                            "(lower clean.min_chars or check the download stage)")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise BertraceError(f"params.yaml: tokenizer.vocab_size={vocab_size} is too small; use e.g. 16000 or 30522")

    counts = char_counts(train_txt)
    alphabet = corpus_alphabet(train_txt, lowercase=lowercase, limit=limit_alphabet, strip_accents=strip_accents,
                               counts=counts)
    continuation = continuation_pieces(train_txt, lowercase=lowercase, alphabet=alphabet, strip_accents=strip_accents)
    trained = _train(_pieces(_line_batches(train_txt)), None, lowercase, vocab_size, min_frequency, alphabet,
                     continuation, progress, strip_accents)

    vocab = trained.get_vocab(with_added_tokens=False)
    late = [t for t, i in vocab.items() if t.startswith("##") and len(t) == 3 and t not in continuation]
    if len(late) > 1:  # cannot happen while pass 1 sees what pass 2 sees; ids would then depend on hash order
        log.warning("%s: continuation pieces %s were not pinned; the vocabulary may differ between runs",
                    train_txt, late[:10])
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise BertraceError(f"{train_txt}: the trained vocabulary has gaps in its ids; rerun the tokenizer stage")
    # The "##x" pieces were registered as special tokens only to pin their ids: rebuild the
    # tokenizer from the trained vocabulary with just the five real special tokens.
    tok = build_tokenizer(lowercase=lowercase, strip_accents=strip_accents)
    tok.model = models.WordPiece(vocab=dict(by_id), unk_token="[UNK]", continuing_subword_prefix="##",
                                 max_input_chars_per_word=100)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    _check_special_ids(tok, train_txt)

    tokenizer_json, vocab_txt = out_dir / "tokenizer.json", out_dir / "vocab.txt"
    with atomic_open(tokenizer_json) as f:
        f.write(tok.to_str(pretty=True))
    with atomic_open(vocab_txt) as f:
        f.write("".join(t + "\n" for t, _ in by_id))
    return {"tokenizer_sha256": sha256_file(tokenizer_json), "vocab_sha256": sha256_file(vocab_txt),
            "vocab_size": len(by_id), "normalizer": normalizer_report(tok, train_txt, counts=counts)}


def _train(batches: Iterator[list[str]], n_sequences: int | None, lowercase: bool, vocab_size: int,
           min_frequency: int, alphabet: list[str], continuation: list[str], progress: bool,
           strip_accents: StripAccents = None):
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


def continuation_pieces(train_txt: Path, *, lowercase: bool, alphabet: list[str],
                        strip_accents: StripAccents = None) -> list[str]:
    """The ``##x`` pieces the trainer creates (``x`` in ``alphabet`` seen inside a word), sorted.

    Found by a no-merge training pass over the distinct space-separated chunks of the corpus:
    normalisation and pre-tokenisation work within a chunk, so the chunks give the same set of
    words as the full text at a fraction of the cost.
    """
    chunks: set[str] = set()
    with open(train_txt, encoding="utf-8") as f:
        for line in f:
            chunks.update(line.rstrip("\n").replace("\t", " ").replace("\r", " ").split(" "))
    chunks.discard("")
    words = sorted(chunks)
    del chunks
    step = 10_000
    batches = ([" ".join(words[i:i + step])] for i in range(0, len(words), step))
    first = _train(batches, None, lowercase, 0, 0, alphabet, [], False, strip_accents)
    return sorted(t for t in first.get_vocab(with_added_tokens=False) if t.startswith("##") and len(t) == 3)


def char_counts(path: Path):
    """Occurrences of every code point in a UTF-8 text file (numpy int64 array of 0x110000; line
    ends not counted)."""
    import numpy as np

    counts = np.zeros(0x110000, dtype=np.int64)
    for batch in _line_batches(Path(path)):
        cps = np.frombuffer("".join(batch).encode("utf-32-le"), dtype=np.uint32)
        counts += np.bincount(cps, minlength=0x110000)
    return counts


def corpus_alphabet(train_txt: Path, *, lowercase: bool, limit: int | None, strip_accents: StripAccents = None,
                    counts=None) -> list[str]:
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


def normalizer_report(tok, text_file: Path, *, counts=None, words_file: Path | None = None,
                      top: int = 8) -> dict[str, Any]:
    """What the tokenizer's normaliser does to the letters of ``text_file`` (UTF-8, one document
    per line): the share of letters, marks and digits (Unicode categories L, M, N) it removes
    (``chars_removed``) or turns into other characters (``chars_changed``; ``é`` → ``e``),
    case folding aside, and their sum ``chars_altered``; ``top``: the most frequent such
    characters. With ``words_file`` (e.g. the valid split), also the share of its whitespace
    words that contain one (``words_altered``) and an ``example`` word.

    Each distinct character is normalised alone: BERT's normalisers work character by character
    (so the counts equal those of the normalised text). ``tok`` is a ``tokenizers.Tokenizer`` or
    the path of a tokenizer.json."""
    if not hasattr(tok, "normalizer"):
        tok = load_tokenizer(tok)
    norm = tok.normalizer
    if counts is None:
        counts = char_counts(text_file)
    lowercase = _normalizer_lowercases(tok)
    import numpy as np

    letters = removed = changed = 0
    altered: list[tuple[int, str, str]] = []  # (count, char, what it becomes)
    for cp in np.flatnonzero(counts):
        ch, n = chr(int(cp)), int(counts[cp])
        if unicodedata.category(ch)[0] not in "LMN":
            continue  # spaces, punctuation, symbols, control and format characters (ZWJ, LRM ...)
        letters += n
        out = "".join((norm.normalize_str(ch) if norm is not None else ch).split())  # CJK padding aside
        ref = ch.lower() if lowercase else ch
        if unicodedata.normalize("NFC", out) in (unicodedata.normalize("NFC", ref), unicodedata.normalize("NFC", ch)):
            continue
        if out:
            changed += n
        else:
            removed += n
        altered.append((n, ch, out))
    altered.sort(key=lambda a: (-a[0], a[1]))
    share = (lambda k: round(k / letters, 6) if letters else 0.0)
    report: dict[str, Any] = {
        "letters": letters, "chars_removed": share(removed), "chars_changed": share(changed),
        "chars_altered": share(removed + changed),
        "top": [{"char": ch, "name": unicodedata.name(ch, f"U+{ord(ch):04X}"), "count": n, "becomes": out}
                for n, ch, out in altered[:top]],
        "altered_chars": "".join(sorted(ch for _, ch, _ in altered)),
    }
    if words_file is not None:
        report.update(words_altered(tok, Path(words_file), report["altered_chars"]))
    return report


def _normalizer_lowercases(tok) -> bool:
    return bool(normalizer_settings(tok)["lowercase"])


def normalizer_settings(tok) -> dict[str, Any]:
    """``{lowercase, strip_accents}`` as params.yaml would say them, read from a tokenizer's
    normaliser (``strip_accents`` None when it is none of BERT's)."""
    import json

    if not hasattr(tok, "to_str"):
        tok = load_tokenizer(tok)
    spec = json.loads(tok.to_str()).get("normalizer") or {}
    parts = spec.get("normalizers", [spec]) if spec.get("type") == "Sequence" else [spec]
    bert = next((p for p in parts if p.get("type") == "BertNormalizer"), None)
    lowercase = any(p.get("type") == "Lowercase" for p in parts) or bool(bert and bert.get("lowercase", True))
    if bert is None:
        return {"lowercase": lowercase, "strip_accents": None}
    if any(p.get("type") == "Replace" for p in parts):
        return {"lowercase": lowercase, "strip_accents": "auto"}
    strip = bert.get("strip_accents")
    return {"lowercase": lowercase, "strip_accents": bool(lowercase if strip is None else strip)}


def words_altered(tok, path: Path, chars: str) -> dict[str, Any]:
    """``{words_altered, example}``: the share of the whitespace words of ``path`` that hold one of
    ``chars`` (a report's ``altered_chars``), and the first such word with its normalised form."""
    if not chars or not Path(path).exists():
        return {"words_altered": 0.0, "example": None}
    if not hasattr(tok, "normalizer"):
        tok = load_tokenizer(tok)
    norm = tok.normalizer
    words = hit = 0
    example = None
    pattern = re.compile("[" + re.escape(chars) + "]")
    for batch in _line_batches(Path(path)):
        for line in batch:
            chunks = line.split()
            words += len(chunks)
            if not pattern.search(line):
                continue
            for w in chunks:
                if pattern.search(w):
                    hit += 1
                    if example is None:
                        example = f"{w} → {norm.normalize_str(w).strip()}"
    return {"words_altered": round(hit / words, 6) if words else 0.0, "example": example}


def describe_alterations(report: dict[str, Any], where: str) -> str:
    """One sentence: how much of ``where`` the normaliser alters, with the example and top chars."""
    top = ", ".join(f"{t['char']} ({t['name'].lower()}) → {t['becomes'] or 'removed'} ×{t['count']}"
                    for t in report.get("top", [])[:3])
    words = (f", {report['words_altered']:.0%} of words" if report.get("words_altered") is not None else "")
    example = f", e.g. {report['example']}" if report.get("example") else ""
    return (f"the tokenizer's normaliser removes or changes {report['chars_altered']:.1%} of the letters of "
            f"{where}{words}{example} (most often: {top})")


def _check_special_ids(tok, where) -> None:
    wrong = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS if tok.token_to_id(t) != SPECIAL_IDS[t]}
    if wrong:
        raise BertraceError(f"{where}: special tokens have ids {wrong}, expected {SPECIAL_IDS}; "
                            "delete data/tokenizer and rerun the tokenizer stage (dvc repro tokenizer)")


def load_tokenizer(path: str | Path):
    """``tokenizers.Tokenizer`` from ``tokenizer.json`` (or a directory holding it), with the
    fixed special ids checked."""
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.exists():
        raise BertraceError(f"{path}: tokenizer not found; run the tokenizer stage (dvc repro tokenizer)")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the Rust side raises plain Exception
        raise BertraceError(f"{path}: not a valid tokenizer file ({str(e)[:200]}); delete it and rerun the "
                            "tokenizer stage (dvc repro tokenizer)") from None
    _check_special_ids(tok, path)
    return tok


def tokenizer_stats(tokenizer_json: Path, valid_txt: Path, max_docs: int | None = None) -> dict:
    """Share of ``[UNK]`` tokens and WordPiece tokens per whitespace word on ``valid_txt``
    (special tokens not counted)."""
    tok = load_tokenizer(tokenizer_json)
    valid_txt = Path(valid_txt)
    if not valid_txt.exists():
        raise BertraceError(f"{valid_txt}: not found; run the clean stage first (dvc repro clean)")
    docs = tokens = unks = words = 0
    for batch in _line_batches(valid_txt):
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


def read_vocab(vocab_txt: Path) -> list[str]:
    """Tokens of a BERT ``vocab.txt`` in id order."""
    with open(vocab_txt, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


__all__ = ["SPECIAL_TOKENS", "SPECIAL_IDS", "build_normalizer", "build_tokenizer", "train_wordpiece",
           "tokenizer_stats", "normalizer_report", "normalizer_settings", "words_altered", "describe_alterations", "load_tokenizer", "read_vocab"]
