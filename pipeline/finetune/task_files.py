"""Task tables: the rows of a split from a local file (``.tsv`` / ``.csv`` / ``.parquet`` /
``.jsonl``, or CoNLL) or the hub, as columns; the helpers every task type's label reader shares.

``.csv`` / ``.tsv`` files: ``delimiter`` (``auto``: tab for ``.tsv``; for ``.csv`` sniffed among
``, ; tab |`` from the file's head) and ``quoting`` (``auto``: none for ``.tsv``, as GLUE writes
them, standard double quotes for ``.csv``; or ``minimal`` / ``none``); headerless files name their
fields with ``header: [name, ...]`` (see :mod:`pipeline.finetune.task_data`)."""

from __future__ import annotations

import csv
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.data.hub import load_split

FILE_SUFFIXES = (".tsv", ".csv", ".parquet", ".jsonl", ".json")
CONLL_SUFFIXES = (".conll",)
QUOTINGS = {"minimal": csv.QUOTE_MINIMAL, "none": csv.QUOTE_NONE}
SNIFF_DELIMITERS = ",;\t|"
SHOW_ROWS = 5  # row numbers a message lists before "and N more"
ROWS_CONVENTION = "1-based, a header line not counted"
TABLE_DEFAULTS = {"delimiter": "auto", "quoting": "auto", "header": True, "format": "auto"}


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def row_numbers(rows: Sequence[int]) -> str:
    """``data rows 3, 8 (1-based, ...)`` of 0-based row indices: the first few and how many more."""
    shown = ", ".join(str(int(i) + 1) for i in rows[:SHOW_ROWS])
    more = f" and {len(rows) - SHOW_ROWS} more" if len(rows) > SHOW_ROWS else ""
    return f"data row{'s' if len(rows) > 1 else ''} {shown}{more} ({ROWS_CONVENTION})"


def print_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def cell_text(v: Any) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return ""
    return v if isinstance(v, str) else str(v)


@dataclass
class Rows:
    columns: dict[str, list]  # column -> values (after renames)
    where: str  # the file or hub id, for messages
    hint: str  # the param that fixes a column problem
    class_names: list[str] | None = None  # a hub ClassLabel's names
    original_columns: list[str] = field(default_factory=list)


def csv_dialect(path: Path, delimiter: str = "auto", quoting: str = "auto") -> dict[str, Any]:
    """``{delimiter, quoting, sniffed}`` for a ``.csv`` / ``.tsv`` file (see the module docstring)."""
    suffix = Path(path).suffix.lower()
    sniffed = False
    if delimiter == "auto":
        delimiter = "\t" if suffix == ".tsv" else ","
        if suffix != ".tsv":
            with open(path, "rb") as f:
                head = f.read(64 << 10).decode("utf-8", errors="ignore")
            lines = head.splitlines()[:50]
            if len(lines) > 1 and not head.endswith("\n"):
                lines = lines[:-1]  # a line cut by the window would mislead the sniffer
            try:
                delimiter = csv.Sniffer().sniff("\n".join(lines), delimiters=SNIFF_DELIMITERS).delimiter
                sniffed = True
            except csv.Error:
                pass  # one column, or too irregular: the default
    if quoting == "auto":
        quoting = "none" if suffix == ".tsv" else "minimal"
    return {"delimiter": delimiter, "quoting": quoting, "sniffed": sniffed}


def read_table(
    path: Path,
    *,
    delimiter: str = "auto",
    quoting: str = "auto",
    dialect: dict[str, Any] | None = None,
    header: bool | list[str] = True,
) -> dict[str, list]:
    """Columns of a ``.tsv`` / ``.csv`` / ``.parquet`` / ``.jsonl`` file (first line = header
    for tsv/csv; CRLF line endings are fine). ``dialect`` (if given) receives what
    :func:`csv_dialect` chose for a csv/tsv file. ``header``: a list of column names reads a
    headerless csv/tsv (see :func:`read_headerless`)."""
    path = Path(path)
    if not path.is_file():
        raise BertraceError(f"{path}: file not found; fix the path in params.yaml (finetune.task) or the mirror")
    suffix = path.suffix.lower()
    import pandas as pd

    try:
        if suffix in (".tsv", ".csv"):
            # TSV as GLUE writes it: no quoting (sentences contain '"'); CSV: standard quoting.
            chosen = csv_dialect(path, delimiter, quoting)
            if dialect is not None:
                dialect.update(chosen)
            if isinstance(header, list):
                return read_headerless(path, header, chosen, dialect)
            df = pd.read_csv(
                path,
                sep=chosen["delimiter"],
                dtype=str,
                keep_default_na=False,
                encoding="utf-8",
                quoting=QUOTINGS[chosen["quoting"]],
            )
            df.columns = [str(c).strip() for c in df.columns]
            return {c: [v.rstrip("\r") if isinstance(v, str) else v for v in df[c].tolist()] for c in df.columns}
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pydict()
        if suffix in (".jsonl", ".json"):
            df = pd.read_json(path, lines=suffix == ".jsonl", dtype=False)
            return {str(c): df[c].tolist() for c in df.columns}
    except BertraceError:
        raise
    except UnicodeDecodeError as e:
        raise BertraceError(f"{path}: not valid UTF-8 ({e.reason}); convert it to UTF-8") from None
    except Exception as e:  # noqa: BLE001 - pandas/pyarrow parse errors of many types
        how = ""
        if suffix in (".tsv", ".csv"):
            chosen = csv_dialect(path, delimiter, quoting)
            how = (
                f" with delimiter {chosen['delimiter']!r}{' (sniffed)' if chosen['sniffed'] else ''} and quoting "
                f"{chosen['quoting']}; set finetune.task.delimiter / finetune.task.quoting, or"
            )
        raise BertraceError(
            f"{path}: cannot be read as {suffix[1:]}{how} ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:200]}); fix or replace the file"
        ) from None
    raise BertraceError(f"{path}: unsupported file type {suffix or '(none)'}; use one of {list(FILE_SUFFIXES)}")


def read_headerless(
    path: Path, names: list[str], chosen: dict[str, Any], dialect: dict[str, Any] | None = None
) -> dict[str, list]:
    """A csv/tsv without a header line, its fields named by ``names`` in order (``csv`` module,
    the delimiter and quoting of ``chosen``). Fields beyond ``names`` are dropped (the original
    STS Benchmark adds license fields on some lines) and counted in ``dialect["extra_fields"]``;
    blank lines are skipped; a line with fewer fields is an error naming it."""
    columns: dict[str, list] = {n: [] for n in names}
    extra = 0
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter=chosen["delimiter"], quoting=QUOTINGS[chosen["quoting"]])
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) < len(names):
                raise BertraceError(
                    f"{path}:{reader.line_num}: {len(row)} fields but finetune.task.header names {len(names)} "
                    f"({names}); fix the line or the header list (delimiter {chosen['delimiter']!r}, quoting "
                    f"{chosen['quoting']})"
                )
            extra += len(row) > len(names)
            for n, v in zip(names, row):
                columns[n].append(v.rstrip("\r"))
    if dialect is not None:
        dialect.update(header=list(names), extra_fields=extra)
    return columns


def _rename(columns: dict[str, list], renames: dict[str, str]) -> dict[str, list]:
    return {renames.get(c, c): v for c, v in columns.items()}


def file_rows(
    path: Path,
    renames: dict[str, str],
    global_renames: dict[str, str],
    hint: str,
    files: dict[str, str],
    p: dict[str, Any] | None = None,
    tables: dict[str, Any] | None = None,
) -> Rows:
    p = p or TABLE_DEFAULTS
    dialect: dict[str, Any] = {}
    if p.get("format") == "conll" or path.suffix.lower() in CONLL_SUFFIXES:
        from pipeline.finetune.token_data import read_conll

        columns = read_conll(path, dialect)
        dialect["format"] = "conll"
    else:
        columns = read_table(
            path, delimiter=p["delimiter"], quoting=p["quoting"], dialect=dialect, header=p.get("header", True)
        )
    if dialect and tables is not None:
        tables[path.as_posix()] = dialect
    files[path.as_posix()] = sha256_file(path)
    original = list(columns)
    columns = _rename(_rename(columns, renames), global_renames)
    return Rows(columns, str(path), hint, None, original)


def hub_rows(
    dataset: str,
    config: str | None,
    revision: str,
    split: str,
    global_renames: dict[str, str],
    label_column: str,
    files: dict[str, str],
) -> Rows:
    where = f"hub dataset {dataset}{'/' + config if config else ''} split {split}"
    ds = load_split(dataset, config, revision, split, key="finetune.task.hub")
    original_label = next((old for old, new in global_renames.items() if new == label_column), label_column)
    label_feature = ds.features.get(original_label)
    # a ClassLabel, or a sequence of them (CoNLL-2003's ner_tags: Sequence/List(ClassLabel))
    class_names = (
        list(
            getattr(label_feature, "names", None)
            or getattr(getattr(label_feature, "feature", None), "names", None)
            or []
        )
        or None
    )
    files[f"hub:{dataset}/{config}/{split}@{revision}"] = ds._fingerprint
    columns = _rename(ds.to_dict(), global_renames)
    return Rows(columns, where, "finetune.task.columns", class_names, list(ds.column_names))


def missing_error(rows: Rows, column: str, what: str, missing: np.ndarray, kept: int) -> BertraceError:
    return BertraceError(
        f"{rows.where}: column {column!r} has no {what} in {len(missing)} of {kept} data rows with text: "
        f"{row_numbers(missing)}; fill in the {what} or delete those rows"
    )


def check_columns(rows: Rows, needed: list[str]) -> None:
    missing = [c for c in needed if c not in rows.columns]
    if missing:
        renamed = (
            f" (after renames; in the file: {rows.original_columns})"
            if rows.original_columns != list(rows.columns)
            else ""
        )
        raise BertraceError(
            f"{rows.where}: no column {missing[0]!r}; columns present: {list(rows.columns)}{renamed}. Set "
            f"finetune.task.text_columns / finetune.task.label_column to the right names, or rename columns "
            f"with {rows.hint}"
        )


__all__ = [
    "Rows",
    "check_columns",
    "cell_text",
    "csv_dialect",
    "file_rows",
    "hub_rows",
    "missing_error",
    "nfc",
    "print_warning",
    "read_headerless",
    "read_table",
    "row_numbers",
]
