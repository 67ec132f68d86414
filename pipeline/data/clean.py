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

Parallelism (``workers``, ``engine``: :mod:`pipeline.data.engine`). This process streams the raw
rows and cuts them into chunks of about ``chunk_chars`` characters, only where no article can
continue across the cut (a source change, a ``<doc`` line, a top-level WikiText heading, any row
of ``documents``), so a chunk's articles are exactly the articles the whole stream gives there.
Workers rebuild and normalise a chunk's articles; this process takes the results back in chunk
order and de-duplicates, splits and writes them, so the output bytes depend on neither
``workers`` nor ``chunk_chars`` (tested).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import unicodedata
from itertools import chain, islice
from pathlib import Path
from typing import Annotated, ClassVar, Iterator

# Workers import this module: keep it light (no pyarrow: ~60 MB per process; pydantic ~10 MB).
from pydantic import Field

from pipeline.core.config import Float, Int
from pipeline.data.engine import Engine, EngineParams, run_tasks
from pipeline.core.errors import BertraceError
from pipeline.core.io import atomic_path
from pipeline.data.raw_corpus import load_raw_manifest


class CleanConfig(EngineParams):
    """The ``clean`` section of params.yaml (defaults equal params.yaml; tests/unit/core/test_config.py)."""

    SECTION: ClassVar[str] = "clean"

    min_chars: Annotated[Int, Field(ge=0)] = 200  # drop articles shorter than this (characters)
    valid_fraction: Annotated[Float, Field(ge=0, lt=1)] = 0.1  # document-level held-out share
    seed: Annotated[Int, Field(ge=0)] = 0  # keys the deterministic train/valid hash split


log = logging.getLogger("bertrace.clean")
_WS = re.compile(r"\s+")
_BR = re.compile(r"<br\s*/?\s*>", re.IGNORECASE)
_HEADING = re.compile(r"((?:= )+)(.*?)((?: =)+)")  # stripped WikiText heading: "= = Title = ="
_WIKITEXT_ESCAPES = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))
_SENTENCE_END = (".", "!", "?")
CHUNK_CHARS = 1 << 18  # raw characters per task (~10 ms of work); in flight: 2 per worker
DASK_CHUNK_CHARS = 1 << 23  # on Dask (~0.2 s of work): a task costs the cluster ~10 ms of CPU on top
MIN_PARALLEL_CHUNKS = 16  # under ~4 MB of text, clean in this process: starting workers costs ~0.5 s


def normalize_text(text: str) -> str:
    """NFC, every whitespace run → one space, stripped.

    ``str.split()`` splits exactly where the regex whitespace class matches (both use
    ``str.isspace``; checked over every code point) and is ~8x faster than a regex substitution."""
    return " ".join(unicodedata.normalize("NFC", text).split())


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


ARTICLE_READERS = {
    "wikitext": wikitext_articles,
    "wikiextractor": wikiextractor_articles,
    "documents": document_articles,
}


def split_score(text: str, seed: int) -> float:
    """Keyed hash of a document mapped to [0, 1); the document goes to valid iff it is below
    ``valid_fraction``. Depends only on the text and the seed."""
    h = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=str(seed).encode("utf-8"))
    return int.from_bytes(h.digest(), "big") / 2.0**64


def _can_cut(prev: tuple[str, str], row: tuple[str, str], nxt: tuple[str, str] | None, fmt: str) -> bool:
    """Whether a chunk may end at ``prev`` and the next start at ``row``: the reader of ``fmt``
    ends the current article at ``row`` whatever came before, and reads ``prev`` the same
    without ``row`` after it (the readers above)."""
    if fmt == "documents" or row[1] != prev[1]:
        return True
    if fmt == "wikiextractor":
        s = row[0].strip()
        return s.startswith("<doc ") or s == "<doc>"
    # WikiText: a top-level title, a blank line before it (which reads the same without a next row) and after it.
    heading = wikitext_heading(row[0])
    return heading is not None and heading[0] == 1 and not prev[0].strip() and _blank_or_edge(nxt, row[1])


def row_chunks(rows: Iterator[tuple[str, str]], fmt: str, chunk_chars: int = CHUNK_CHARS) -> Iterator[list]:
    """Consecutive ``(text, source)`` rows in lists of at least ``chunk_chars`` characters (the
    last one shorter), cut only where :func:`_can_cut`; reading each list alone gives the same
    articles as reading them all."""
    chunk: list[tuple[str, str]] = []
    size = 0
    for prev, row, nxt in _with_neighbours(rows):
        if size >= chunk_chars and _can_cut(prev, row, nxt, fmt):
            yield chunk
            chunk, size = [], 0
        chunk.append(row)
        size += len(row[0])
    if chunk:
        yield chunk


def _clean_chunk(shared: tuple, rows: list[tuple[str, str]]) -> tuple[int, int, list[tuple]]:
    """One task: the chunk's articles, normalised, as ``(articles, dropped short, kept)``; each kept
    one is ``(UTF-8 line, dedup digest, split score, chars, words)``, so the main process only
    de-duplicates and writes."""
    fmt, min_chars, seed = shared
    n = short = 0
    kept = []
    for article in ARTICLE_READERS[fmt](iter(rows)):
        n += 1
        text = normalize_text(article)
        if not text or len(text) < min_chars:  # empty articles never make it (no empty lines)
            short += 1
            continue
        line = (text + "\n").encode("utf-8")
        digest = hashlib.blake2b(line[:-1], digest_size=16).digest()
        kept.append((line, digest, split_score(text, seed), len(text), text.count(" ") + 1))
    return n, short, kept


def clean_corpus(
    raw_dir: Path,
    out_dir: Path,
    *,
    min_chars: int,
    valid_fraction: float,
    seed: int,
    workers: int = 0,
    engine: str | Engine = "local",
    scheduler: str | None = None,
    chunk_chars: int | None = None,
    progress: bool = True,
) -> dict:
    """Write ``out_dir/train.txt`` and ``out_dir/valid.txt`` (one article per line) from the
    download stage's ``raw_dir``; return counts (documents read, dropped, kept, chars, words).

    ``workers`` processes (0 = all cores, 1 = this process) or a Dask ``engine`` normalise the
    articles (see the module docstring); a local run of fewer than ``MIN_PARALLEL_CHUNKS`` chunks
    stays in this process. ``chunk_chars`` sets the task size (never the output); default
    ``CHUNK_CHARS``, or ``DASK_CHUNK_CHARS`` on Dask."""
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    if not 0.0 <= float(valid_fraction) < 1.0:
        raise BertraceError(f"params.yaml: clean.valid_fraction is {valid_fraction}; use a value in [0, 1)")
    if not isinstance(engine, Engine):
        engine = Engine.from_params({"engine": engine, "workers": workers, "dask_scheduler": scheduler}, "clean")
    manifest = load_raw_manifest(raw_dir)
    fmt = manifest["format"]
    if chunk_chars is None:
        chunk_chars = DASK_CHUNK_CHARS if engine.kind == "dask" else CHUNK_CHARS
    chunks = row_chunks(_iter_raw_rows(raw_dir, manifest, progress), fmt, chunk_chars)
    first = list(islice(chunks, MIN_PARALLEL_CHUNKS)) if engine.kind == "local" else []
    if engine.kind == "local" and len(first) < MIN_PARALLEL_CHUNKS:
        engine = Engine("local", 1)
    results = run_tasks(
        _clean_chunk, (fmt, min_chars, seed), ((c,) for c in chain(first, chunks)), engine, what="clean", ordered=True
    )

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
        with open(train_tmp, "wb") as ftrain, open(valid_tmp, "wb") as fvalid:
            for _, (n_articles, n_short, kept) in results:  # in chunk order: the order of the corpus
                stats["documents"] += n_articles
                stats["dropped_short"] += n_short
                for line, digest, score, chars, words in kept:
                    if digest in seen:
                        stats["dropped_duplicate"] += 1
                        continue
                    seen.add(digest)
                    split = "valid" if score < valid_fraction else "train"
                    index = stats[f"{split}_documents"]
                    if split == "train" and (lowest_train is None or score < lowest_train[0]):
                        lowest_train = (score, index)
                    if split == "valid" and (highest_valid is None or score > highest_valid[0]):
                        highest_valid = (score, index)
                    (fvalid if split == "valid" else ftrain).write(line)
                    _count(stats, split, chars, words, +1)

        kept = stats["train_documents"] + stats["valid_documents"]
        hint = _paragraphs_hint(manifest, stats)
        if kept == 0:
            raise BertraceError(
                f"{raw_dir}: no documents left after cleaning ({stats['documents']} read, {stats['dropped_short']} "
                f"shorter than clean.min_chars={min_chars}, {stats['dropped_duplicate']} duplicates); lower "
                f"clean.min_chars or check the download stage's source (data/raw/manifest.json){hint}"
            )
        if hint and stats["dropped_short"] > stats["documents"] // 2:
            log.warning(
                "clean: %d of %d documents are shorter than clean.min_chars=%d and were dropped%s",
                stats["dropped_short"],
                stats["documents"],
                min_chars,
                hint,
            )
        # Guarantee one document on each side (deterministically: the one closest to the threshold).
        if kept >= 2 and stats["valid_documents"] == 0:
            _move_line(train_tmp, lowest_train[1], valid_tmp, stats, "train", "valid")
        elif kept >= 2 and stats["train_documents"] == 0:
            _move_line(valid_tmp, highest_valid[1], train_tmp, stats, "valid", "train")
    return stats


def _paragraphs_hint(manifest: dict, stats: dict) -> str:
    """When local text files were read as blank-line separated documents (``documents``), each
    file may rather be one article whose paragraphs became documents: say how to read it so."""
    source = manifest.get("source") or {}
    files = [
        f for f in source.get("files") or [] if not str(f.get("path", "")).endswith((".parquet", ".jsonl", ".json"))
    ]
    if (
        manifest.get("format") != "documents"
        or source.get("type") != "local"
        or manifest.get("layout")
        or len(files) < 2
        or stats["documents"] < 2 * len(files)
    ):
        return ""
    return (
        f"; {len(files)} text files gave {stats['documents']} documents: if each file is one article with "
        "blank lines between its paragraphs, set download.local.format: document_per_file"
    )


def _count(stats: dict, split: str, chars: int, words: int, sign: int) -> None:
    stats[f"{split}_documents"] += sign
    stats[f"{split}_chars"] += sign * chars
    stats[f"{split}_words"] += sign * words  # space-separated chunks: spaces + 1 (text is normalised)


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
    _count(stats, src_split, len(text), text.count(" ") + 1, -1)
    _count(stats, dst_split, len(text), text.count(" ") + 1, +1)


def _iter_raw_rows(raw_dir: Path, manifest: dict, progress: bool) -> Iterator[tuple[str, str]]:
    """(text, source) rows of the download stage's Parquet parts, in order, streamed."""
    import pyarrow.parquet as pq
    from tqdm.auto import tqdm

    total = manifest.get("total_rows")
    names: dict[str, str] = {}  # one str per source: a task's pickle then holds it once, not once per row
    with tqdm(total=total, desc="clean", unit=" rows", disable=not progress, mininterval=1.0) as bar:
        for part in manifest["parts"]:
            path = raw_dir / part["path"]
            if not path.exists():
                raise BertraceError(
                    f"{path}: listed in {raw_dir / 'manifest.json'} but missing; "
                    "rerun the download stage (dvc repro download)"
                )
            try:
                # Read a column chunk 1 MB at a time, not whole: the download stage's row groups hold
                # ~16 MB of text (Arrow's peak while reading one: 31 MB at once, 12 MB buffered).
                pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
                batches = pf.iter_batches(batch_size=8192, columns=["text", "source"])
                for batch in batches:
                    texts = batch.column(0).to_pylist()
                    sources = [names.setdefault(s, s) for s in batch.column(1).to_pylist()]
                    yield from zip(texts, sources)
                    bar.update(len(texts))
            except (OSError, KeyError, ValueError) as e:  # pyarrow's ArrowInvalid / ArrowIOError
                raise BertraceError(f"{path}: unreadable download part ({e}); rerun the download stage") from None
