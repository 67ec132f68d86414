"""Bench corpora built from ``../shared/data``: a source slice, replicated N times, then the
pipeline's own download → clean → tokenizer steps (library calls, no DVC, no MLflow).

Replicas must survive the clean stage's de-duplication, so replica ``k > 0`` renames every
article title (``Title`` → ``Title r{k}``): the text is the same size and the same words,
but each replica is a new set of documents.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))

_WIKITEXT_TITLE = re.compile(r"^ = ([^=].*[^=]) = $")


def source_files(source: str) -> list[Path]:
    """The shared files of a bench source: ``wikitext`` (WikiText-2 raw test split, 1.3 MB) or
    ``enwikiN`` (the first N files, ~1 MB each, of the WikiExtractor extract)."""
    if source == "wikitext":
        files = [SHARED / "wikitext-2-raw" / "wiki.test.raw"]
    elif source.startswith("enwiki"):
        n = int(source[len("enwiki") :] or 1)
        files = sorted((SHARED / "enwiki-extract" / "AA").glob("wiki_*"))[:n]
    else:
        raise SystemExit(f"unknown bench source {source!r}: use wikitext or enwikiN (N = number of 1 MB files)")
    missing = [f for f in files if not f.exists()]
    if not files or missing:
        raise SystemExit(f"{missing or source}: bench data not found under {SHARED} (see its README.md)")
    return files


def _rename_titles(line: str, k: int, fmt: str, state: dict) -> str:
    if fmt == "wikitext":
        m = _WIKITEXT_TITLE.match(line.rstrip("\n"))
        return f" = {m.group(1)} r{k} = \n" if m else line
    if line.startswith("<doc"):
        state["title_next"] = True
        return line
    if state.get("title_next") and line.strip():
        state["title_next"] = False
        return line.rstrip("\n") + f" r{k}\n"
    return line


def replicate(source: str, times: int, out_dir: Path) -> Path:
    """Write ``times`` renamed copies of the source files into ``out_dir``; return it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fmt = "wikitext" if source == "wikitext" else "wikiextractor"
    for k in range(times):
        for f in source_files(source):
            state: dict = {}
            dst = out_dir / (
                f"r{k:03d}-{f.name}" + (".raw" if fmt == "wikitext" and not f.name.endswith(".raw") else "")
            )
            with open(f, encoding="utf-8") as fin, open(dst, "w", encoding="utf-8") as fout:
                for line in fin:
                    fout.write(line if k == 0 else _rename_titles(line, k, fmt, state))
    return out_dir


def download(src_dir: Path, raw_dir: Path) -> dict:
    from pipeline.data.download import download_corpus

    return download_corpus(
        {"source": "local", "local": {"path": str(src_dir), "format": "auto"}}, raw_dir, progress=False
    )


def clean(raw_dir: Path, clean_dir: Path, valid_fraction: float = 0.1) -> dict:
    from pipeline.data.clean import clean_corpus

    return clean_corpus(raw_dir, clean_dir, min_chars=200, valid_fraction=valid_fraction, seed=0, progress=False)


def tokenizer(clean_dir: Path, tok_dir: Path, vocab_size: int = 16000) -> dict:
    from pipeline.data.tokenizer_training import train_wordpiece

    return train_wordpiece(
        clean_dir / "train.txt", tok_dir, vocab_size=vocab_size, lowercase=True, min_frequency=2, progress=False
    )


def prepare(source: str, times: int, work: Path, *, valid_fraction: float = 0.1) -> Path:
    """Replicate, download, clean and train the tokenizer under ``work``; reuse a finished one."""
    done = work / ".prepared"
    if done.exists():
        return work
    replicate(source, times, work / "src")
    download(work / "src", work / "raw")
    clean(work / "raw", work / "clean", valid_fraction)
    tokenizer(work / "clean", work / "tokenizer")
    done.touch()
    return work
