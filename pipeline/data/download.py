"""Download stage: bring a text corpus into ``data/raw`` as Parquet parts plus a manifest.

Sources:

* ``hub``: a Hugging Face dataset (``datasets.load_dataset``), pinned to the commit sha its
  revision resolves to. Offline machines point ``download.mirror`` (or ``BERTRACE_HUB_MIRROR``)
  at local copies of the same dataset; see :mod:`pipeline.data.hub`.
* ``local``: a file, a directory or a glob of WikiText files, WikiExtractor output, or
  document files (Parquet / JSON lines with a text column, plain text with blank lines
  between documents), or, with ``format: document_per_file``, text files that each hold one
  document (an article per file, blank lines between its paragraphs; the file name may give
  the title: ``title_from_filename``).

Nothing is parsed here beyond splitting files into rows: WikiText and WikiExtractor sources are
stored one raw line per row, documents one per row (a ``document_per_file`` file is one row, its
paragraphs separated by a blank line, and the manifest's format is ``documents``). The clean
stage rebuilds articles.
The outputs carry no timestamps, so the same input gives byte-identical files.
"""

from __future__ import annotations

import contextlib
import glob as globlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from pipeline.core.config import Bool, Section, Str
from pipeline.core.errors import BertraceError
from pipeline.data.hub import load_split, resolve_mirror, resolve_revision
from pipeline.core.io import sha256_file, write_json
from pipeline.data.raw_corpus import FORMATS

log = logging.getLogger("bertrace.corpus")

MANIFEST_VERSION = 1
SCHEMA = pa.schema([("text", pa.string()), ("source", pa.string())])

# Output layout: a part holds up to PART_BYTES of text, written in row groups of up to
# ROW_GROUP_BYTES; memory use is bounded by one row group, whatever the corpus size.
PART_BYTES = 256 << 20
ROW_GROUP_BYTES = 16 << 20
ROW_GROUP_ROWS = 100_000

TEXT_SUFFIXES = {".raw", ".txt", ".tokens", ""}  # "" = no extension (WikiExtractor's AA/wiki_00)
TABLE_SUFFIXES = {".parquet", ".jsonl", ".json"}

_SNIFF_BYTES = 64 << 10
_WIKITEXT_TITLE = re.compile(r"= [^=](?:.*[^=])? =")  # stripped " = Title = " (one '=' each side)


SourceFormat = Literal["auto", "wikitext", "wikiextractor", "documents", "document_per_file"]
PER_FILE = "document_per_file"  # a reading layout of local text files; the rows it gives are documents
_SENTENCE_END = (".", "!", "?", "।", "॥", "。", "！", "？", "؟", "۔", "።", "։", "…")


class HubSource(Section):
    dataset: Str = "stanfordnlp/imdb"
    config: Str | None = "plain_text"
    revision: Str = "main"  # a branch, tag or commit sha of the dataset repo
    splits: list[Str] = Field(default_factory=lambda: ["unsupervised"], min_length=1)
    text_column: Str = "text"
    format: SourceFormat = "documents"


class LocalSource(Section):
    path: Str = "data/sources"  # file, directory or glob; a DVC dependency
    format: SourceFormat = "auto"
    text_column: Str = "text"  # for .parquet / .jsonl sources
    title_from_filename: Bool = False  # document_per_file: the file name (without extension) opens the document


class DownloadConfig(Section):
    """The ``download`` section of params.yaml (defaults equal params.yaml; tests/unit/core/test_config.py)."""

    SECTION: ClassVar[str] = "download"

    source: Literal["hub", "local"] = "hub"
    hub: HubSource = Field(default_factory=HubSource)
    local: LocalSource = Field(default_factory=LocalSource)
    mirror: Str = ""  # YAML index or directory of local copies of hub datasets (env BERTRACE_HUB_MIRROR)


# ---------------------------------------------------------------------------------------------
# Public entry point
# ---------------------------------------------------------------------------------------------
def download_corpus(params: dict, out_dir: Path, *, mirror: str | None = None, progress: bool = True) -> dict:
    """Write ``out_dir/part-NNNNN.parquet`` (columns ``text``, ``source``) and ``manifest.json``.

    ``params`` is the ``download`` section of params.yaml. ``mirror`` (a YAML index or a
    directory, see :func:`pipeline.data.hub.resolve_mirror`) overrides ``params["mirror"]`` and redirects hub
    datasets to local copies. Returns the manifest.
    """
    out_dir = Path(out_dir)
    params = DownloadConfig.from_params(params).to_dict()
    source = params["source"]
    mirror = mirror or params["mirror"] or None
    if source == "hub":
        plan = _plan_hub(params.get("hub") or {}, mirror)
    elif source == "local":
        plan = _plan_local(params.get("local") or {})
    else:
        raise BertraceError(f"params.yaml: download.source is {source!r}; use 'hub' or 'local'")

    with _replace_dir(out_dir) as tmp_dir:
        writer = _PartWriter(tmp_dir)
        rows: dict[str, int] = {}
        with _progress(progress, "download") as bar:
            for key, label, row_iter in plan["inputs"]:
                n = 0
                for text in row_iter:
                    writer.add(text, label)
                    n += 1
                    if n % 10_000 == 0:
                        bar.update(10_000)
                bar.update(n % 10_000)
                rows[key] = n
        parts = writer.close()
        for f in plan["manifest"]["source"].get("files", []):
            f["rows"] = rows[f.get("split", f["path"])]  # mirror files are keyed by split, local ones by path
        total = sum(rows.values())
        if total == 0:
            raise BertraceError(
                f"{plan['where']}: no rows were read; check that the files hold text "
                f"(download.{source}) and rerun the download stage"
            )
        manifest = {
            "schema_version": MANIFEST_VERSION,
            **plan["manifest"],
            "rows": rows,
            "total_rows": total,
            "parts": parts,
        }
        write_json(tmp_dir / "manifest.json", manifest)
    return manifest


# ---------------------------------------------------------------------------------------------
# Hub and mirror
# ---------------------------------------------------------------------------------------------
def _plan_hub(hub: dict, mirror: str | None) -> dict:
    dataset = hub.get("dataset")
    if not dataset:
        raise BertraceError(
            "params.yaml: download.hub.dataset is empty; name a Hugging Face dataset "
            "(e.g. Salesforce/wikitext) or set download.source: local"
        )
    config = hub.get("config") or None
    revision = str(hub.get("revision") or "main")
    splits = list(hub.get("splits") or ["train"])
    text_column = hub.get("text_column") or "text"
    fmt = hub.get("format") or "auto"
    _check_format(fmt, "download.hub.format")
    if fmt == PER_FILE:
        raise BertraceError(
            "params.yaml: download.hub.format is document_per_file, which reads local text files; "
            "a hub dataset has one document per row: use documents (or set download.source: local)"
        )
    source: dict[str, Any] = {
        "type": "hub",
        "dataset": dataset,
        "config": config,
        "revision": revision,
        "resolved_revision": None,
        "splits": splits,
        "missing_splits": [],
    }

    if mirror:
        paths = resolve_mirror(mirror, dataset, config, splits)
        source["missing_splits"] = [s for s in splits if s not in paths]
        if fmt == "auto":
            fmt = _common_format({str(p): _sniff_file(p, text_column) for p in paths.values()})
        source["files"] = [
            {"split": s, "path": p.as_posix(), "sha256": sha256_file(p), "bytes": p.stat().st_size}
            for s, p in paths.items()
        ]
        inputs = [(s, s, _read_file(p, fmt, text_column)) for s, p in paths.items()]
        where = f"mirror {mirror}"
    else:
        source["resolved_revision"] = resolve_revision(dataset, config, revision, key="download.hub")
        pinned = source["resolved_revision"] or revision
        loaded = {s: _load_hub_split(dataset, config, pinned, s, text_column) for s in splits}
        if fmt == "auto":
            fmt = _sniff_rows(_hub_rows(loaded[splits[0]], text_column, limit=200))
        inputs = [(s, s, _hub_rows(ds, text_column, fmt=fmt)) for s, ds in loaded.items()]
        where = f"hub dataset {dataset}"
    return {
        "inputs": inputs,
        "where": where,
        "manifest": {
            "format": fmt,
            "text_column": text_column,
            "source": source,
            "mirror": str(mirror) if mirror else None,
        },
    }


def _load_hub_split(dataset: str, config: str | None, revision: str, split: str, text_column: str):
    ds = load_split(dataset, config, revision, split, key="download.hub")
    if text_column not in ds.column_names:
        name = f"{dataset}/{config}" if config else dataset
        raise BertraceError(
            f"hub dataset {name} split {split}: no column {text_column!r} "
            f"(columns: {ds.column_names}); set download.hub.text_column"
        )
    return ds


def _hub_rows(ds, text_column: str, *, fmt: str = "documents", limit: int | None = None) -> Iterator[str]:
    n = 0
    for batch in ds.iter(batch_size=10_000):
        for text in batch[text_column]:
            yield _line_row(text) if fmt in ("wikitext", "wikiextractor") else (text or "")
            n += 1
            if limit is not None and n >= limit:
                return


# ---------------------------------------------------------------------------------------------
# Local files
# ---------------------------------------------------------------------------------------------
def _plan_local(local: dict) -> dict:
    raw_path = local.get("path")
    if not raw_path:
        raise BertraceError("params.yaml: download.local.path is empty; set it to a file, directory or glob")
    fmt = local.get("format") or "auto"
    _check_format(fmt, "download.local.format")
    text_column = local.get("text_column") or "text"
    files, skipped = list_source_files(raw_path)
    titles = bool(local.get("title_from_filename"))
    if titles and fmt != PER_FILE:
        raise BertraceError(
            f"params.yaml: download.local.title_from_filename is true but download.local.format is "
            f"{fmt}; titles from file names need format: {PER_FILE} (one document per file)"
        )
    if fmt == PER_FILE:
        for f in files:
            if not _is_table(f):
                _head_text(f)  # binary or not UTF-8: a clear error now, not half-way through
        inputs = [(f.as_posix(), f.as_posix(), _read_file(f, fmt, text_column, titles=titles)) for f in files]
        layout, fmt = PER_FILE, "documents"
    else:
        formats = {
            str(f): (_sniff_file(f, text_column) if fmt == "auto" else _check_file(f, fmt, text_column)) for f in files
        }
        fmt = _common_format(formats)
        layout = None
        inputs = [(f.as_posix(), f.as_posix(), _read_file(f, fmt, text_column)) for f in files]
    source = {
        "type": "local",
        "path": str(raw_path),
        "files": [{"path": f.as_posix(), "sha256": sha256_file(f), "bytes": f.stat().st_size} for f in files],
        "skipped": [s.as_posix() for s in skipped],
    }
    manifest = {"format": fmt, "text_column": text_column, "source": source, "mirror": None}
    if layout:
        manifest["layout"] = layout
        manifest["titles_from_filenames"] = titles
    return {"inputs": inputs, "where": str(raw_path), "manifest": manifest}


def list_source_files(path: str | os.PathLike) -> tuple[list[Path], list[Path]]:
    """Files of a local source (a file, a directory walked recursively, or a glob), sorted,
    hidden files skipped; returns (files, skipped files with unsupported extensions)."""
    spec = str(path)
    if any(ch in spec for ch in "*?["):
        roots = [Path(p) for p in sorted(globlib.glob(os.path.expanduser(spec), recursive=True))]
        if not roots:
            raise BertraceError(f"download.local.path {spec!r}: the glob matches no files; fix the pattern")
    else:
        p = Path(os.path.expanduser(spec))
        if not p.exists():
            raise BertraceError(
                f"download.local.path {spec}: not found; put the corpus files there or point "
                "download.local.path at a file, directory or glob"
            )
        roots = [p]
    files: list[Path] = []
    skipped: list[Path] = []
    for root in roots:
        if root.is_dir():
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                for name in sorted(filenames):
                    if not name.startswith("."):
                        (files if _supported(name) else skipped).append(Path(dirpath) / name)
        elif root.is_file() and (len(roots) == 1 and root == Path(os.path.expanduser(spec))):
            files.append(root)  # a file named explicitly is read whatever its extension
        elif root.is_file() and not root.name.startswith("."):
            (files if _supported(root.name) else skipped).append(root)
    files = sorted(set(files), key=lambda f: f.as_posix())
    if not files:
        raise BertraceError(
            f"download.local.path {spec}: no corpus files found (accepted: .raw .txt .tokens "
            f".parquet .jsonl .json and extension-less WikiExtractor files"
            f"{'; skipped ' + ', '.join(s.name for s in skipped[:5]) if skipped else ''})"
        )
    return files, skipped


def _supported(name: str) -> bool:
    suffix = Path(name).suffix.lower()
    return suffix in TEXT_SUFFIXES or suffix in TABLE_SUFFIXES or not _looks_like_ext(suffix)


def _looks_like_ext(suffix: str) -> bool:
    # "wiki_00" has no suffix; names like "wiki.test.raw" do. Treat short alphabetic suffixes as extensions.
    return bool(re.fullmatch(r"\.[A-Za-z][A-Za-z0-9]{0,5}", suffix))


def _check_format(fmt: str, key: str) -> None:
    if fmt not in FORMATS + ("auto", PER_FILE):
        raise BertraceError(f"params.yaml: {key} is {fmt!r}; use one of auto, {', '.join(FORMATS)}, {PER_FILE}")


def _common_format(formats: dict[str, str]) -> str:
    kinds = sorted(set(formats.values()))
    if len(kinds) == 1:
        return kinds[0]
    examples = "; ".join(f"{k}: {next(f for f, v in formats.items() if v == k)}" for k in kinds)
    raise BertraceError(
        f"the source files mix formats ({examples}); keep one format per corpus or set download.local.format explicitly"
    )


def _is_table(path: Path) -> bool:
    return path.suffix.lower() in TABLE_SUFFIXES


def _head_text(path: Path) -> str:
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    if b"\x00" in head:
        raise BertraceError(
            f"{path}: looks binary (NUL bytes), not a text corpus; remove it from the source "
            "or convert it to UTF-8 text / .parquet / .jsonl"
        )
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start >= len(head) - 4:  # a multi-byte character cut by the sniff window
            return head[: e.start].decode("utf-8")
        line = head[: e.start].count(b"\n") + 1
        raise BertraceError(_not_utf8(path, line, e)) from None


def _sniff_rows(rows: Iterable[str]) -> str:
    """Format of line/document rows: the first non-blank row decides."""
    for row in rows:
        s = row.strip()
        if s:
            if s.startswith("<doc ") or s.startswith("<doc>"):
                return "wikiextractor"
            return "wikitext" if _WIKITEXT_TITLE.fullmatch(s) else "documents"
    return "documents"


def _sniff_file(path: Path, text_column: str) -> str:
    """auto format: tables are sniffed by their first rows, text files by their first 64 KiB
    (a WikiExtractor ``<doc`` line, a WikiText `` = Title = `` line, else documents)."""
    if _is_table(path):
        return _sniff_rows(_iter_table(path, text_column, limit=200))
    head = _head_text(path)
    lines = head.split("\n")
    first = next((ln.strip() for ln in lines if ln.strip()), "")
    if first.startswith("<doc ") or "\n<doc id=" in head:
        return "wikiextractor"
    if path.suffix.lower() in (".raw", ".tokens") or any(_WIKITEXT_TITLE.fullmatch(ln.strip()) for ln in lines):
        return "wikitext"
    return "documents"


def _check_file(path: Path, fmt: str, text_column: str) -> str:
    """Explicit format: fail early when a file cannot be read that way."""
    if _is_table(path):
        next(iter(_iter_table(path, text_column, limit=1)), None)  # raises on a wrong column
    else:
        head = _head_text(path)
        if fmt == "wikiextractor" and "<doc" not in head:
            raise BertraceError(
                f"{path}: no '<doc id=... title=...>' line in its first 64 KiB, so it is not "
                "WikiExtractor output; set download.local.format to auto, wikitext or documents"
            )
    return fmt


def _read_file(path: Path, fmt: str, text_column: str, *, titles: bool = False) -> Iterator[str]:
    """Rows of one source file: lines for wikitext/wikiextractor, documents otherwise (a whole
    text file for document_per_file)."""
    if _is_table(path):
        rows = _iter_table(path, text_column)
        if fmt in ("documents", PER_FILE):
            yield from rows
        else:
            for row in rows:
                yield _line_row(row)
    elif fmt == "documents":
        yield from _blank_line_documents(_iter_lines(path))
    elif fmt == PER_FILE:
        paragraphs = list(_blank_line_documents(_iter_lines(path)))
        if titles:
            paragraphs.insert(0, file_title(path))
        text = "\n\n".join(p for p in paragraphs if p.strip())
        if text:
            yield text
    else:
        for line in _iter_lines(path):
            yield _line_row(line)


def file_title(path: Path) -> str:
    """A document title from a file name: the name without its extension, ``_`` as spaces
    (Wikipedia's convention), NFC, ending as a sentence (the clean stage's convention for titles),
    e.g. ``অক্সিজেন.txt`` → ``অক্সিজেন.``."""
    import unicodedata

    stem = path.name[: -len(path.suffix)] if _looks_like_ext(path.suffix) else path.name
    title = " ".join(unicodedata.normalize("NFC", stem.replace("_", " ")).split())
    return title if not title or title.endswith(_SENTENCE_END) else title + "."


def _line_row(line: str | None) -> str:
    """A raw line as stored: without its line ending, and blank lines as "" (the form the
    Hugging Face WikiText rows take, so hub, mirror and local copies give the same rows)."""
    if not line:
        return ""
    line = line.rstrip("\r\n")
    return line if line.strip() else ""


def _iter_lines(path: Path) -> Iterator[str]:
    """UTF-8 lines split on "\\n" only (str.splitlines would also split on U+2028 and friends)."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise BertraceError(_not_utf8(path, lineno, e)) from None
            if lineno == 1 and line.startswith("\ufeff"):
                line = line[1:]
            yield line


def _not_utf8(path: Path, lineno: int, e: UnicodeDecodeError) -> str:
    return (
        f"{path}: line {lineno} is not valid UTF-8 ({e.reason}); convert the file to UTF-8 "
        f"(e.g. `iconv -f latin1 -t utf-8 in > out`) or remove it from the source"
    )


def _blank_line_documents(lines: Iterable[str]) -> Iterator[str]:
    doc: list[str] = []
    for line in lines:
        if line.strip():
            doc.append(line.rstrip("\r\n"))
        elif doc:
            yield "\n".join(doc)
            doc = []
    if doc:
        yield "\n".join(doc)


def _iter_table(path: Path, text_column: str, *, limit: int | None = None) -> Iterator[str]:
    n = 0
    for text in (_iter_parquet if path.suffix.lower() == ".parquet" else _iter_json)(path, text_column):
        yield text
        n += 1
        if limit is not None and n >= limit:
            return


def _iter_parquet(path: Path, text_column: str) -> Iterator[str]:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise BertraceError(f"{path}: not a readable Parquet file ({e}); replace or remove it") from None
    names = pf.schema_arrow.names
    if text_column not in names:
        raise BertraceError(
            f"{path}: no column {text_column!r} (columns: {names}); set download.local.text_column "
            f"(or download.hub.text_column) to the column holding the text"
        )
    col_type = pf.schema_arrow.field(text_column).type
    if not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)):
        raise BertraceError(
            f"{path}: column {text_column!r} has type {col_type}, not text; choose a string column (columns: {names})"
        )
    for batch in pf.iter_batches(batch_size=8192, columns=[text_column]):
        for text in batch.column(0).to_pylist():
            yield text or ""


def _iter_json(path: Path, text_column: str) -> Iterator[str]:
    head = _head_text(path).lstrip("\ufeff \t\r\n")
    if head.startswith("["):  # a JSON array (not streamed; JSON lines are)
        try:
            records = json.loads(path.read_text(encoding="utf-8-sig"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BertraceError(f"{path}: not valid JSON ({e}); fix it or convert it to JSON lines") from None
        items: Iterable[tuple[int, Any]] = enumerate(records, 1)
    else:
        items = _json_lines(path)
    for lineno, rec in items:
        if not isinstance(rec, dict):
            raise BertraceError(
                f"{path}: record {lineno} is a {type(rec).__name__}, not an object with a "
                f"{text_column!r} field; write one JSON object per line"
            )
        if text_column not in rec:
            raise BertraceError(
                f"{path}: record {lineno} has no {text_column!r} field (fields: {sorted(rec)}); "
                "set download.local.text_column to the field holding the text"
            )
        text = rec[text_column]
        if text is not None and not isinstance(text, str):
            raise BertraceError(f"{path}: record {lineno}: {text_column!r} is a {type(text).__name__}, not text")
        yield text or ""


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    for lineno, line in enumerate(_iter_lines(path), 1):
        if line.strip():
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise BertraceError(f"{path}: line {lineno} is not valid JSON ({e}); fix or remove it") from None


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------
class _PartWriter:
    """Streams rows into zstd Parquet parts of bounded size."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.parts: list[dict] = []
        self._writer: pq.ParquetWriter | None = None
        self._texts: list[str] = []
        self._sources: list[str] = []
        self._buf_bytes = 0
        self._part_bytes = 0
        self._part_rows = 0

    def add(self, text: str, source: str) -> None:
        self._texts.append(text)
        self._sources.append(source)
        self._buf_bytes += len(text)
        if self._buf_bytes >= ROW_GROUP_BYTES or len(self._texts) >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._texts:
            return
        if self._writer is None:
            path = self.out_dir / f"part-{len(self.parts):05d}.parquet"
            self._writer = pq.ParquetWriter(path, SCHEMA, compression="zstd")
            self.parts.append({"path": path.name, "rows": 0})
        self._writer.write_table(pa.table([self._texts, self._sources], schema=SCHEMA))
        self._part_rows += len(self._texts)
        self._part_bytes += self._buf_bytes
        self._texts, self._sources, self._buf_bytes = [], [], 0
        if self._part_bytes >= PART_BYTES:
            self._close_part()

    def _close_part(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            part = self.parts[-1]
            part["rows"] = self._part_rows
            part["sha256"] = sha256_file(self.out_dir / part["path"])
            self._part_rows = self._part_bytes = 0

    def close(self) -> list[dict]:
        self._flush()
        self._close_part()
        return self.parts


@contextlib.contextmanager
def _replace_dir(out_dir: Path) -> Iterator[Path]:
    """Build a directory next to ``out_dir`` and swap it into place on success.

    Refuses to replace a directory holding anything but a previous download (so a wrong
    ``out_dir`` never deletes user files)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise BertraceError(f"{out_dir}: exists and is not a directory; remove it and rerun the download stage")
    if out_dir.exists():
        strangers = [
            p.name
            for p in out_dir.iterdir()
            if not (p.name == "manifest.json" or re.fullmatch(r"part-\d{5}\.parquet", p.name))
        ]
        if strangers:
            raise BertraceError(
                f"{out_dir}: holds files the download stage did not write ({strangers[:5]}); "
                "move them away or choose another output directory"
            )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the output is an ordinary directory
    try:
        yield tmp
        old = None
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def _progress(enabled: bool, desc: str):
    from tqdm.auto import tqdm

    with tqdm(desc=desc, unit=" rows", disable=not enabled, mininterval=1.0) as bar:
        yield bar
