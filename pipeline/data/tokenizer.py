"""The BERT WordPiece tokenizer of every stage: how it normalises, splits and is loaded.

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

This module builds, loads and describes a tokenizer; training one is
:mod:`pipeline.data.tokenizer_training` (the tokenizer stage's only), so the stages that load the
vocabulary do not depend on the trainer.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Any, Iterator, Literal

from pipeline.core.errors import BertraceError
from pipeline.core.formats import SEP_ID, SPECIAL_IDS, SPECIAL_TOKENS  # [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4

BATCH_LINES = 256
BATCH_CHARS = 1 << 20  # a line is a whole document: bound batches by size too, or memory follows the corpus
# The accents of Latin, Greek and Cyrillic: what strip_accents: auto removes (after NFD, when lowercasing).
COMBINING_DIACRITICS = "[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]"


StripAccents = Literal["auto"] | bool | None


def build_normalizer(*, lowercase: bool, strip_accents: StripAccents = None):
    """BERT's normaliser: ``BertNormalizer`` (clean text, CJK spacing, case, accents) for
    ``strip_accents`` true/false (None: strip iff lowercase, Google's rule), or for ``auto`` with
    lowercasing, ``BertNormalizer`` (no stripping) → NFD → delete :data:`COMBINING_DIACRITICS` → NFC
    (see the module docstring). Every step works character by character, as ``pipeline.data.encode``
    and :func:`_pieces` assume."""
    from tokenizers import Regex, normalizers

    if strip_accents is None:
        strip_accents = lowercase
    if strip_accents == "auto" and not lowercase:
        strip_accents = False  # cased BERT strips nothing
    if strip_accents == "auto":
        return normalizers.Sequence(
            [
                normalizers.BertNormalizer(
                    clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=True
                ),
                normalizers.NFD(),
                normalizers.Replace(Regex(COMBINING_DIACRITICS), ""),
                normalizers.NFC(),
            ]
        )
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=bool(strip_accents), lowercase=lowercase
    )


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


def line_batches(path: Path) -> Iterator[list[str]]:
    """Lines of a text file in batches of at most ``BATCH_LINES`` lines and about ``BATCH_CHARS``
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
            if len(batch) >= BATCH_LINES or size >= BATCH_CHARS:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def char_counts(path: Path):
    """Occurrences of every code point in a UTF-8 text file (numpy int64 array of 0x110000; line
    ends not counted)."""
    import numpy as np

    counts = np.zeros(0x110000, dtype=np.int64)
    for batch in line_batches(Path(path)):
        cps = np.frombuffer("".join(batch).encode("utf-32-le"), dtype=np.uint32)
        counts += np.bincount(cps, minlength=0x110000)
    return counts


def normalizer_report(
    tok, text_file: Path, *, counts=None, words_file: Path | None = None, top: int = 8
) -> dict[str, Any]:
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
    share = lambda k: round(k / letters, 6) if letters else 0.0  # noqa: E731
    report: dict[str, Any] = {
        "letters": letters,
        "chars_removed": share(removed),
        "chars_changed": share(changed),
        "chars_altered": share(removed + changed),
        "top": [
            {"char": ch, "name": unicodedata.name(ch, f"U+{ord(ch):04X}"), "count": n, "becomes": out}
            for n, ch, out in altered[:top]
        ],
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
    for batch in line_batches(Path(path)):
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
    top = ", ".join(
        f"{t['char']} ({t['name'].lower()}) → {t['becomes'] or 'removed'} ×{t['count']}"
        for t in report.get("top", [])[:3]
    )
    words = f", {report['words_altered']:.0%} of words" if report.get("words_altered") is not None else ""
    example = f", e.g. {report['example']}" if report.get("example") else ""
    return (
        f"the tokenizer's normaliser removes or changes {report['chars_altered']:.1%} of the letters of "
        f"{where}{words}{example} (most often: {top})"
    )


def check_special_ids(tok, where) -> None:
    """Raise naming ``where`` unless the special tokens have the fixed ids of pipeline/core/formats.py."""
    wrong = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS if tok.token_to_id(t) != SPECIAL_IDS[t]}
    if wrong:
        raise BertraceError(
            f"{where}: special tokens have ids {wrong}, expected {SPECIAL_IDS}; "
            "delete data/tokenizer and rerun the tokenizer stage (dvc repro tokenizer)"
        )


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
        raise BertraceError(
            f"{path}: not a valid tokenizer file ({str(e)[:200]}); delete it and rerun the "
            "tokenizer stage (dvc repro tokenizer)"
        ) from None
    check_special_ids(tok, path)
    return tok


def read_vocab(vocab_txt: Path) -> list[str]:
    """Tokens of a BERT ``vocab.txt`` in id order."""
    with open(vocab_txt, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


__all__ = [
    "SPECIAL_TOKENS",
    "SPECIAL_IDS",
    "build_normalizer",
    "build_tokenizer",
    "line_batches",
    "char_counts",
    "normalizer_report",
    "normalizer_settings",
    "words_altered",
    "describe_alterations",
    "load_tokenizer",
    "read_vocab",
]


def find_tokenizer(checkpoint: Path, tokenizer_path: str | Path | None) -> Path:
    """``tokenizer_path``, else ``tokenizer.json`` next to the checkpoint, else the pipeline's
    ``data/tokenizer/tokenizer.json`` (``../tokenizer/`` from ``data/pretrain``)."""
    if tokenizer_path:
        return Path(tokenizer_path)
    candidates = [checkpoint.parent / "tokenizer.json", checkpoint.parent.parent / "tokenizer" / "tokenizer.json"]
    for c in candidates:
        if c.is_file():
            return c
    raise BertraceError(
        f"{checkpoint}: no tokenizer.json found at {', '.join(map(str, candidates))}; pass the "
        "tokenizer the checkpoint was trained with (--tokenizer data/tokenizer/tokenizer.json)"
    )


def encode_prompt(tokenizer, prompt: str, bos_id: int = SEP_ID) -> list[int]:
    """A causal LM's prompt: ``[SEP]`` (which ends every document of the causal examples) + the
    prompt's WordPiece ids (no ``[CLS]`` / trailing ``[SEP]``)."""
    return [bos_id, *tokenizer.encode(prompt, add_special_tokens=False).ids]
