"""Clean stage: raw rows → one normalised, deduplicated article per line, split train/valid.

Articles are rebuilt per source format:

* WikiText: an article starts at each top-level heading `` = Title = `` (one ``=`` each side);
  sub-headings `` = = Section = = `` stay inside it. Headings become sentences ending in "."
  (WikiExtractor's convention for section headings), so the sentence splitter keeps them apart.
  WikiText's number/hyphen escapes are undone: `` @-@ `` → ``-``, `` @,@ `` → ``,``, `` @.@ `` → ``.``.
* WikiExtractor: each ``<doc ...>`` … ``</doc>`` block; its first line (the title) gets a ".".
* documents: each row is a document; HTML line breaks (IMDB's ``<br />``) become spaces.

Every article is NFC-normalised and its whitespace runs (newlines, tabs, U+2028 …) collapsed to
one space. The train/valid split is per document and keyed by a hash of the text, so a document
stays on its side when other documents are added or removed.
"""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq

from pipeline.corpus import load_manifest
from pipeline.errors import BertraceError
from pipeline.io import atomic_path

_WS = re.compile(r"\s+")
_BR = re.compile(r"<br\s*/?\s*>", re.IGNORECASE)
_HEADING = re.compile(r"((?:= )+)(.*?)((?: =)+)")  # stripped WikiText heading: "= = Title = ="
_WIKITEXT_ESCAPES = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))
_SENTENCE_END = (".", "!", "?")


def normalize_text(text: str) -> str:
    """NFC, every whitespace run → one space, stripped."""
    return _WS.sub(" ", unicodedata.normalize("NFC", text)).strip()


def as_sentence(heading: str) -> str:
    """A heading as a sentence: stripped, ending in "." unless it already ends a sentence."""
    heading = heading.strip()
    return heading if not heading or heading.endswith(_SENTENCE_END) else heading + "."


def wikitext_heading(line: str) -> tuple[int, str] | None:
    """(level, title) of a WikiText heading line such as `` = = Gameplay = = `` (level 2), else None."""
    m = _HEADING.fullmatch(line.strip())
    if not m or not m.group(2).strip():
        return None
    left, right = m.group(1).count("="), m.group(3).count("=")
    return (left, m.group(2).strip()) if left == right else None


def wikitext_articles(rows: Iterator[tuple[str, str]]) -> Iterator[str]:
    """Articles from WikiText lines, ``(line, source)`` pairs.

    A heading counts only with a blank line (or the start/end of its source) on both sides, as
    WikiText writes them: lines like `` = 1 henry and capacitance C = `` inside a paragraph are
    formula fragments, not titles. Text before the first title of a source becomes its own
    document; an article never spans two source files/splits.
    """
    parts: list[str] = []
    for prev, (line, source), nxt in _with_neighbours(rows):
        heading = wikitext_heading(line)
        if heading is not None and not (_blank_or_edge(prev, source) and _blank_or_edge(nxt, source)):
            heading = None
        if (heading is not None and heading[0] == 1) or (prev is not None and prev[1] != source):
            if parts:
                yield _unescape_wikitext(" ".join(parts))
            parts = []
        if heading is not None:
            parts.append(as_sentence(heading[1]))
        elif line.strip():
            parts.append(line)
    if parts:
        yield _unescape_wikitext(" ".join(parts))


def _with_neighbours(rows):
    """(previous, current, next) over an iterator; None past either end."""
    prev = cur = None
    for row in rows:
        if cur is not None:
            yield prev, cur, row
        prev, cur = cur, row
    if cur is not None:
        yield prev, cur, None


def _blank_or_edge(row: tuple[str, str] | None, source: str) -> bool:
    return row is None or row[1] != source or not row[0].strip()


def _unescape_wikitext(text: str) -> str:
    text = _WS.sub(" ", text)
    for old, new in _WIKITEXT_ESCAPES:
        text = text.replace(old, new)
    return text


def wikiextractor_articles(rows: Iterator[tuple[str, str]]) -> Iterator[str]:
    """Articles from WikiExtractor lines: one per ``<doc>`` block, title line turned into a sentence.
    Lines outside blocks are ignored; an unclosed block ends at the next ``<doc`` or source change."""
    parts: list[str] | None = None
    current = None
    for line, source in rows:
        s = line.strip()
        if source != current:
            if parts:
                yield " ".join(parts)
            parts, current = None, source
        if s.startswith("<doc ") or s == "<doc>":
            if parts:
                yield " ".join(parts)
            parts = []
        elif s == "</doc>":
            if parts:
                yield " ".join(parts)
            parts = None
        elif parts is not None and s:
            parts.append(as_sentence(s) if not parts else s)
    if parts:
        yield " ".join(parts)


def document_articles(rows: Iterator[tuple[str, str]]) -> Iterator[str]:
    for text, _ in rows:
        yield _BR.sub(" ", text)


ARTICLE_READERS = {"wikitext": wikitext_articles, "wikiextractor": wikiextractor_articles, "documents": document_articles}


def split_score(text: str, seed: int) -> float:
    """Keyed hash of a document mapped to [0, 1); the document goes to valid iff it is below
    ``valid_fraction``. Depends only on the text and the seed."""
    h = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=str(seed).encode("utf-8"))
    return int.from_bytes(h.digest(), "big") / 2.0**64


def clean_corpus(raw_dir: Path, out_dir: Path, *, min_chars: int, valid_fraction: float, seed: int,
                 progress: bool = True) -> dict:
    """Write ``out_dir/train.txt`` and ``out_dir/valid.txt`` (one article per line) from the
    download stage's ``raw_dir``; return counts (documents read, dropped, kept, chars, words)."""
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    if not 0.0 <= float(valid_fraction) < 1.0:
        raise BertraceError(f"params.yaml: clean.valid_fraction is {valid_fraction}; use a value in [0, 1)")
    manifest = load_manifest(raw_dir)
    fmt = manifest["format"]
    rows = _iter_raw_rows(raw_dir, manifest, progress)

    seen: set[bytes] = set()
    stats = {"documents": 0, "dropped_short": 0, "dropped_duplicate": 0}
    for split in ("train", "valid"):
        stats.update({f"{split}_documents": 0, f"{split}_chars": 0, f"{split}_words": 0})
    # Fallback candidates if one side ends up empty: (score, line index) of the train document
    # with the lowest score and the valid document with the highest.
    lowest_train: tuple[float, int] | None = None
    highest_valid: tuple[float, int] | None = None

    train_path, valid_path = out_dir / "train.txt", out_dir / "valid.txt"
    with atomic_path(train_path) as train_tmp, atomic_path(valid_path) as valid_tmp:
        with open(train_tmp, "w", encoding="utf-8", newline="\n") as ftrain, \
             open(valid_tmp, "w", encoding="utf-8", newline="\n") as fvalid:
            for article in ARTICLE_READERS[fmt](rows):
                stats["documents"] += 1
                text = normalize_text(article)
                if not text or len(text) < min_chars:  # empty articles never make it (no empty lines)
                    stats["dropped_short"] += 1
                    continue
                digest = hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
                if digest in seen:
                    stats["dropped_duplicate"] += 1
                    continue
                seen.add(digest)
                score = split_score(text, seed)
                split = "valid" if score < valid_fraction else "train"
                index = stats[f"{split}_documents"]
                if split == "train" and (lowest_train is None or score < lowest_train[0]):
                    lowest_train = (score, index)
                if split == "valid" and (highest_valid is None or score > highest_valid[0]):
                    highest_valid = (score, index)
                (fvalid if split == "valid" else ftrain).write(text + "\n")
                _count(stats, split, text, +1)

        kept = stats["train_documents"] + stats["valid_documents"]
        if kept == 0:
            raise BertraceError(
                f"{raw_dir}: no documents left after cleaning ({stats['documents']} read, {stats['dropped_short']} "
                f"shorter than clean.min_chars={min_chars}, {stats['dropped_duplicate']} duplicates); lower "
                f"clean.min_chars or check the download stage's source (data/raw/manifest.json)")
        # Guarantee one document on each side (deterministically: the one closest to the threshold).
        if kept >= 2 and stats["valid_documents"] == 0:
            _move_line(train_tmp, lowest_train[1], valid_tmp, stats, "train", "valid")
        elif kept >= 2 and stats["train_documents"] == 0:
            _move_line(valid_tmp, highest_valid[1], train_tmp, stats, "valid", "train")
    return stats


def _count(stats: dict, split: str, text: str, sign: int) -> None:
    stats[f"{split}_documents"] += sign
    stats[f"{split}_chars"] += sign * len(text)
    stats[f"{split}_words"] += sign * len(text.split(" "))


def _move_line(src: Path, index: int, dst: Path, stats: dict, src_split: str, dst_split: str) -> None:
    """Move line ``index`` of ``src`` to the end of ``dst`` (streaming copy of ``src``)."""
    tmp = src.with_name(src.name + ".move")
    moved = None
    with open(src, encoding="utf-8") as fin, open(tmp, "w", encoding="utf-8", newline="\n") as fout:
        for i, line in enumerate(fin):
            if i == index:
                moved = line
            else:
                fout.write(line)
    os.replace(tmp, src)
    with open(dst, "a", encoding="utf-8", newline="\n") as f:
        f.write(moved)
    text = moved.rstrip("\n")
    _count(stats, src_split, text, -1)
    _count(stats, dst_split, text, +1)


def _iter_raw_rows(raw_dir: Path, manifest: dict, progress: bool) -> Iterator[tuple[str, str]]:
    """(text, source) rows of the download stage's Parquet parts, in order, streamed."""
    from tqdm.auto import tqdm

    total = manifest.get("total_rows")
    with tqdm(total=total, desc="clean", unit=" rows", disable=not progress, mininterval=1.0) as bar:
        for part in manifest["parts"]:
            path = raw_dir / part["path"]
            if not path.exists():
                raise BertraceError(f"{path}: listed in {raw_dir / 'manifest.json'} but missing; "
                                    "rerun the download stage (dvc repro download)")
            try:
                pf = pq.ParquetFile(path)
                batches = pf.iter_batches(batch_size=8192, columns=["text", "source"])
                for batch in batches:
                    texts = batch.column(0).to_pylist()
                    sources = batch.column(1).to_pylist()
                    yield from zip(texts, sources)
                    bar.update(len(texts))
            except (OSError, KeyError, ValueError) as e:  # pyarrow's ArrowInvalid / ArrowIOError
                raise BertraceError(f"{path}: unreadable download part ({e}); rerun the download stage") from None
