"""Rule-based sentence splitting for the NSP segments, beyond English, without NLTK.

BERT's ``create_pretraining_data.py`` expects "one sentence per line" input, because the
A/B segments of next-sentence prediction are cut at sentence boundaries. Our clean corpus
has one *document* per line, so we split documents here with a few regular expressions:

* Latin-script ``.`` ``!`` ``?`` ``…`` (optionally followed by closing quotes/brackets)
  end a sentence only when whitespace follows, so decimals ("3.5") and dotted words
  ("U.S.A.") inside a sentence never split. A single ``.`` after a known abbreviation
  (Mr. Dr. St. e.g. i.e. etc. vs. ...), after a single capital initial ("J. R. R. Tolkien"),
  after a dotted abbreviation ("U.S.") or "No." before a number does not split either.
* Bengali/Hindi danda ``।`` ``॥``, CJK ``。！？｡``, Arabic ``؟`` and Urdu ``۔`` always end a
  sentence; no space needs to follow (CJK text has none).

No case heuristic is used (a lower-cased corpus still splits).
"""

from __future__ import annotations

import re

# Lower-cased, without the final period. Words that often end a sentence ("Inc.", "ft.")
# are left out on purpose: splitting there is the lesser evil for NSP.
ABBREVIATIONS = frozenset(
    """mr mrs ms messrs dr prof st jr sr vs etc cf al approx fig figs vol vols mt gen lt col
    sgt capt cmdr rev hon esq""".split()
)

_CLOSERS = "\"'”’)\\]»›」』）】"
_BOUNDARY = re.compile(
    r"(?=[.!?…।॥؟۔。！？｡])"  # (lets the regex engine skip to candidate characters: 2x faster)
    rf"(?:(?P<latin>[.!?…]+)[{_CLOSERS}]*(?=\s)"  # Latin: needs whitespace after
    rf"|[।॥؟۔。！？｡]+[{_CLOSERS}]*)"  # danda, CJK, Arabic, Urdu: never need a space
)
_DOTTED = re.compile(r"^(?:[^\W\d_]\.)+[^\W\d_]$")  # U.S, e.g, i.e, a.m
_INITIAL = re.compile(r"^[A-Z]$")
_OPENERS = "\"'“‘([{«‹「『（【"


def _is_abbreviation(text: str, dot: int) -> bool:
    """True if the single ``.`` at ``text[dot]`` closes an abbreviation, not a sentence."""
    window = text[max(0, dot - 32) : dot]
    if not window or window[-1].isspace():
        return False  # " ." with a space before it (WikiText style): a real stop
    word = window.split()[-1].lstrip(_OPENERS)  # the last word before the dot (at most 32 chars)
    low = word.lower()
    if low in ABBREVIATIONS or _INITIAL.match(word) or _DOTTED.match(word):
        return True
    if low in ("no", "nos"):  # "No. 5" is a number sign, "said no. Then" is a stop
        rest = text[dot + 1 : dot + 4].lstrip()
        return rest[:1].isdigit()
    return False


def split_sentences(text: str) -> list[str]:
    """Split one document into stripped, non-empty sentences."""
    sentences: list[str] = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        latin = m.group("latin")
        if latin == "." and _is_abbreviation(text, m.start("latin")):
            continue
        piece = text[start : m.end()].strip()
        if piece:
            sentences.append(piece)
        start = m.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences
