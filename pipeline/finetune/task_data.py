"""Task data for fine-tuning (classification, token classification, regression): rows from the
hub (or its mirror) or local files, turned into WordPiece ids.

A task is described by the ``finetune.task`` params section:

* ``source: hub`` loads ``hub.dataset``/``hub.config`` (default GLUE SST-2, ``nyu-mll/glue`` /
  ``sst2``) with ``datasets.load_dataset``; with a hub mirror (``BERTRACE_HUB_MIRROR`` or
  ``finetune.mirror``, see :mod:`pipeline.data.hub`) the local copies are read
  instead. A mirror entry may be a path or ``{path: ..., columns: {old: new}}`` to rename a
  local copy's columns to the hub's names (SST-2's local dev/test call the text ``content``).
* ``source: local`` reads ``local: {split: file}`` (``.tsv`` / ``.csv`` / ``.parquet`` /
  ``.jsonl``), each entry again a path or ``{path, columns}``.

``text_columns`` names one column (single sentence) or two (sentence pair); ``label_column``
holds ints (indices into ``label_names``) or strings (mapped through ``label_names``).
``splits`` says which split plays train / validation / test; a ``null`` validation split is
carved out of train (``validation_fraction``).

``.csv`` / ``.tsv`` files: ``delimiter`` (``auto``: tab for ``.tsv``; for ``.csv`` sniffed among
``, ; tab |`` from the file's head) and ``quoting`` (``auto``: none for ``.tsv``, as GLUE writes
them, standard double quotes for ``.csv``; or ``minimal`` / ``none``); the choice made for each
file is recorded in the task's ``source.tables`` (checkpoint and provenance).

``type`` (default ``classification``) picks the task type:

* ``classification``: one label per example, as above;
* ``regression``: one float per example (STS-B's 0..5 similarity), ``label_names: []``;
* ``token_classification`` (NER): ``text_columns`` names one column of word lists and
  ``label_column`` one of tag lists (ints indexing ``label_names`` or tag strings), e.g. the hub's
  CoNLL-2003 ``tokens`` / ``ner_tags``; a CoNLL file (``.conll``, or any suffix with
  ``format: conll``) gives those two columns. Tags must be BIO (IOB2). Word labels go to the
  first WordPiece of each word, the other pieces get -100 (:mod:`pipeline.finetune.token_data`).

Rows are checked in this order (rows numbered from 1, a header line not counted, as "data rows"):

* a row whose text is empty (an empty or whitespace-only cell, or null, in any of the
  ``text_columns``; token classification: no words) is skipped in every role, train, validation
  and test alike, so a metric's denominator leaves it out; each file's count and first few rows
  are one warning line, each role's count :attr:`TaskSplit.skipped`;
* a kept row without a label (an empty cell, null or -1) is an error naming the rows, unless the
  whole split has none (an unlabelled test split);
* label names from the file, from ``label_names`` and from a hub ClassLabel are compared in
  Unicode NFC, so a decomposed ``é`` (``e`` + U+0301) matches a composed one.

Headerless ``.csv`` / ``.tsv`` files (the original STS Benchmark): ``header: [name, ...]`` names
the fields in order; fields beyond the list are dropped (counted in ``source.tables``), a line
with fewer fields is an error naming the line. ``header: true`` (default): the first line names
the columns.

Sequences are ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` (run_classifier.py
``convert_single_example``), cut to ``max_len`` by ``head`` (keep the start) or ``head_tail``
(keep the start and the end: Sun et al. 2019, "How to Fine-Tune BERT for Text
Classification?", section 5.3.1, best on IMDB with 128 head + 382 tail tokens of 512).
"""

from __future__ import annotations

import csv
import math
import os
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal, Sequence

import numpy as np
import torch
from pydantic import BeforeValidator, Field, field_validator, model_validator

from pipeline.core.config import Float, Int, Section, Str
from pipeline.core.errors import BertraceError
from pipeline.core.formats import CLS_ID, PAD_ID, SEP_ID
from pipeline.core.io import sha256_file
from pipeline.data.hub import entry, load_split, resolve_mirror_entries, resolve_revision

IGNORE_INDEX = -100  # label of positions the loss skips (torch's cross_entropy default)
ROLES = ("train", "validation", "test")
TRUNCATIONS = ("head", "head_tail")
FILE_SUFFIXES = (".tsv", ".csv", ".parquet", ".jsonl", ".json")
TASK_TYPES = ("classification", "token_classification", "regression")
CONLL_SUFFIXES = (".conll",)
QUOTINGS = {"minimal": csv.QUOTE_MINIMAL, "none": csv.QUOTE_NONE}
SNIFF_DELIMITERS = ",;\t|"
SHOW_ROWS = 5  # row numbers a message lists before "and N more"
ROWS_CONVENTION = "1-based, a header line not counted"


def _name(value: Any) -> Any:
    """A label name as text (YAML reads ``[0, 1]`` as numbers)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _row_numbers(rows: Sequence[int]) -> str:
    """``data rows 3, 8 (1-based, ...)`` of 0-based row indices: the first few and how many more."""
    shown = ", ".join(str(int(i) + 1) for i in rows[:SHOW_ROWS])
    more = f" and {len(rows) - SHOW_ROWS} more" if len(rows) > SHOW_ROWS else ""
    return f"data row{'s' if len(rows) > 1 else ''} {shown}{more} ({ROWS_CONVENTION})"


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


_TEXT_COLUMNS = "one column (single sentence) or two (sentence pair)"


class TaskHub(Section):
    """``finetune.task.hub``: the hub dataset (or its mirror entry) of ``source: hub``."""

    SECTION: ClassVar[str] = "finetune.task.hub"

    dataset: Str = "nyu-mll/glue"
    config: Str | None = "sst2"
    revision: Str = "main"  # a branch, tag or commit sha of the dataset repo (the resolved sha is recorded)


class TaskSplits(Section):
    """``finetune.task.splits``: the source split that plays each role (validation null: carved from train)."""

    SECTION: ClassVar[str] = "finetune.task.splits"

    train: Str = "train"
    validation: Str | None = "validation"
    test: Str | None = "test"


class TaskSample(Section):
    """``finetune.task.max_examples``: a random subset per role, for CPU budgets (null: all rows)."""

    SECTION: ClassVar[str] = "finetune.task.max_examples"

    train: Annotated[Int, Field(ge=1)] | None = None
    validation: Annotated[Int, Field(ge=1)] | None = None
    test: Annotated[Int, Field(ge=1)] | None = None


class TaskParams(Section):
    """``finetune.task``: what the task is and where its rows come from (the module docstring).

    Field order is params.yaml's, so the recorded task reads as the file does."""

    SECTION: ClassVar[str] = "finetune.task"

    type: Literal["classification", "token_classification", "regression"] = "classification"
    source: Literal["hub", "local"] = "hub"
    hub: TaskHub = TaskHub()
    local: dict[Str, Any] = {}  # split -> file | {path: file, columns: {old: new}} (pipeline.data.hub.entry)
    columns: dict[Str, Str] = {}  # renames {old: new} for every split
    text_columns: Annotated[list[Str], Field(min_length=1, max_length=2, description=_TEXT_COLUMNS)] = ["sentence"]
    label_column: Str = "label"
    label_names: list[Annotated[Str, BeforeValidator(_name)]] = ["negative", "positive"]
    splits: TaskSplits = TaskSplits()
    validation_fraction: Annotated[Float, Field(gt=0, lt=1)] = 0.1  # carved from train when splits.validation is null
    max_examples: TaskSample = TaskSample()
    sample_seed: Annotated[Int, Field(ge=0)] = 0
    delimiter: Str = "auto"  # .csv/.tsv: auto or one character
    quoting: Literal["auto", "minimal", "none"] = "auto"
    header: Literal[True] | Annotated[list[Str], Field(min_length=1)] = True
    format: Literal["auto", "conll"] = "auto"  # auto: by suffix (.conll is CoNLL); conll: every local file

    @field_validator("text_columns", mode="before")
    @classmethod
    def _one_column(cls, v):
        return [v] if isinstance(v, str) else v  # text_columns: sentence means [sentence]

    @field_validator("delimiter")
    @classmethod
    def _delimiter(cls, v: str) -> str:
        if v != "auto" and (len(v) != 1 or v in '"\r\n'):
            raise ValueError("use auto or one character, e.g. ';' or \"\\t\" (double quotes in YAML for a tab)")
        return v

    @field_validator("header", mode="before")
    @classmethod
    def _header(cls, v):
        if v is not True and not (
            isinstance(v, list) and v and all(isinstance(h, str) and h.strip() for h in v) and len(set(v)) == len(v)
        ):
            raise ValueError(
                "use true (the first line names the columns) or, for a headerless .csv/.tsv, the list "
                "of its column names in order, e.g. [genre, file, year, id, score, sentence1, sentence2]"
            )
        return v

    @model_validator(mode="after")
    def _per_type(self) -> "TaskParams":
        if self.type == "token_classification" and len(self.text_columns) != 1:
            raise BertraceError(
                f"params.yaml: finetune.task.text_columns is {self.text_columns!r}; token_classification "
                "reads one column of word lists (e.g. [tokens])"
            )
        if self.type == "regression" and self.label_names:
            raise BertraceError(
                f"params.yaml: finetune.task.label_names is {self.label_names!r}; a regression task "
                "predicts one number and has no label names: set finetune.task.label_names: []"
            )
        return self


# ---------------------------------------------------------------------------------------------
# Tokenized data
# ---------------------------------------------------------------------------------------------
@dataclass
class TaskSplit(torch.utils.data.Dataset):
    """One tokenized split: unpadded id lists (padded per batch by :func:`collate_task_batch`)."""

    role: str  # train | validation | test
    split: str  # the split's name at the source
    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    # classification: int64 [N]; regression: float32 [N]; token_classification: per example the
    # per-position label ids (-100 but at each word's first sub-token). None when unlabelled.
    labels: torch.Tensor | list[list[int]] | None
    source: str  # file path or hub id, for messages
    truncated: int = 0  # examples cut to max_len
    task_type: str = "classification"
    # token_classification only: per example the word tag ids, and each word's first sub-token
    # position (-1: cut by max_len or no pieces); words without a position are predicted 'O'
    word_labels: list[list[int]] | None = None
    first: list[list[int]] | None = None
    words: list[list[str]] | None = None
    bio_violations: int = 0  # I-X tags not after B-X / I-X (token_classification)
    multi_tags: int = 0  # CoNLL tag fields with several comma-separated tags, read as the first
    skipped: int = 0  # rows of this role's part of the source split skipped for empty text (no words)

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int):
        if self.task_type == "token_classification":
            label = [IGNORE_INDEX] * len(self.input_ids[i]) if self.labels is None else self.labels[i]
        elif self.task_type == "regression":
            label = math.nan if self.labels is None else float(self.labels[i])
        else:
            label = -100 if self.labels is None else int(self.labels[i])
        return self.input_ids[i], self.token_type_ids[i], label

    def label_counts(self, num_labels: int) -> list[int]:
        if self.labels is None or self.task_type != "classification":
            return []
        return torch.bincount(self.labels, minlength=num_labels).tolist()


@dataclass
class TaskData:
    splits: dict[str, TaskSplit]  # role -> split
    label_names: list[str]
    text_columns: list[str]
    label_column: str
    max_len: int
    truncation: str
    files: dict[str, str] = field(default_factory=dict)  # path (or hub id) -> sha256 (or fingerprint)
    source: dict[str, Any] = field(default_factory=dict)  # where the rows came from (for provenance)
    task_type: str = "classification"

    @property
    def num_labels(self) -> int:
        """Outputs of the model's head: one for regression, else one per label name."""
        return 1 if self.task_type == "regression" else len(self.label_names)

    def task_info(self) -> dict[str, Any]:
        """The ``task`` entry of the fine-tuned checkpoint (docs/formats.md), plus where the data came from."""
        return {
            "type": self.task_type,
            "text_columns": list(self.text_columns),
            "max_len": self.max_len,
            "truncation": self.truncation,
            "label_column": self.label_column,
            "source": self.source,
            "splits": {r: s.split for r, s in self.splits.items()},
        }


def collate_task_batch(batch: Sequence[tuple[list[int], list[int], Any]]) -> dict[str, torch.Tensor]:
    """Pad a list of ``(input_ids, token_type_ids, label)`` to the batch's longest sequence.

    ``label``: an int (classification: int64 ``[B]``), a float (regression: float32 ``[B]``) or a
    per-position list (token classification: int64 ``[B, T]``, padding -100)."""
    T = max(len(ids) for ids, _, _ in batch)
    input_ids = torch.full((len(batch), T), PAD_ID, dtype=torch.long)
    token_type_ids = torch.zeros((len(batch), T), dtype=torch.long)
    attention_mask = torch.zeros((len(batch), T), dtype=torch.long)
    for i, (ids, types, _) in enumerate(batch):
        n = len(ids)
        input_ids[i, :n] = torch.tensor(ids)
        token_type_ids[i, :n] = torch.tensor(types)
        attention_mask[i, :n] = 1
    first = batch[0][2]
    if isinstance(first, (list, tuple)):
        labels = torch.full((len(batch), T), IGNORE_INDEX, dtype=torch.long)
        for i, (_, _, lab) in enumerate(batch):
            labels[i, : len(lab)] = torch.tensor(lab, dtype=torch.long)
    elif isinstance(first, float):
        labels = torch.tensor([label for _, _, label in batch], dtype=torch.float32)
    else:
        labels = torch.tensor([label for _, _, label in batch], dtype=torch.long)
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "labels": labels,
    }


# ---------------------------------------------------------------------------------------------
# Truncation and encoding
# ---------------------------------------------------------------------------------------------
def head_tail_split(n: int) -> int:
    """Head tokens kept when ``n`` tokens of a segment fit: 128 of 510 as Sun et al. (2019)
    (max_len 512), scaled down proportionally for shorter budgets."""
    return min(128, n * 128 // 510)


def cut(ids: list[int], n: int, truncation: str) -> list[int]:
    """Keep ``n`` of ``ids``: the first ``n`` (head) or a head and a tail (head_tail)."""
    if len(ids) <= n:
        return ids
    if truncation == "head" or n <= 0:
        return ids[:n]
    h = head_tail_split(n)
    return ids[:h] + ids[len(ids) - (n - h) :]


def pair_budget(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Google's ``_truncate_seq_pair``: shorten the longer segment one token at a time
    (ties: B, i.e. the one popped in run_classifier.py when A is not longer)."""
    while len_a + len_b > budget:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


def encode_examples(
    tokenizer, texts_a: list[str], texts_b: list[str] | None, max_len: int, truncation: str = "head"
) -> tuple[list[list[int]], list[list[int]], int]:
    """``(input_ids, token_type_ids, n_truncated)`` for single sentences or pairs."""
    if truncation not in TRUNCATIONS:
        raise BertraceError(f"params.yaml: finetune.truncation is {truncation!r}; use one of {list(TRUNCATIONS)}")
    min_len = 3 if texts_b is None else 5
    if max_len < min_len:
        raise BertraceError(f"params.yaml: finetune.max_len {max_len} is too small; it must be at least {min_len}")
    enc_a = [e.ids for e in tokenizer.encode_batch(texts_a, add_special_tokens=False)]
    enc_b = None if texts_b is None else [e.ids for e in tokenizer.encode_batch(texts_b, add_special_tokens=False)]
    all_ids, all_types, n_cut = [], [], 0
    for i, a in enumerate(enc_a):
        if enc_b is None:
            budget = max_len - 2
            n_cut += len(a) > budget
            a = cut(a, budget, truncation)
            ids = [CLS_ID, *a, SEP_ID]
            types = [0] * len(ids)
        else:
            b = enc_b[i]
            budget = max_len - 3
            la, lb = pair_budget(len(a), len(b), budget)
            n_cut += (la, lb) != (len(a), len(b))
            a, b = cut(a, la, truncation), cut(b, lb, truncation)
            ids = [CLS_ID, *a, SEP_ID, *b, SEP_ID]
            types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        all_ids.append(ids)
        all_types.append(types)
    return all_ids, all_types, n_cut


# ---------------------------------------------------------------------------------------------
# Rows: hub, mirror, local files
# ---------------------------------------------------------------------------------------------
@dataclass
class _Rows:
    columns: dict[str, list]  # column -> values (after renames)
    where: str  # the file or hub id, for messages
    hint: str  # the param that fixes a column problem
    class_names: list[str] | None = None  # a hub ClassLabel's names
    original_columns: list[str] = field(default_factory=list)


def task_params(params: "TaskParams | dict | None") -> dict[str, Any]:
    """``finetune.task`` checked (:class:`TaskParams`) and as plain values, every key filled in."""
    if not isinstance(params, TaskParams):
        params = TaskParams.from_params(params)
    return params.to_dict()


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


def _file_rows(
    path: Path,
    renames: dict[str, str],
    global_renames: dict[str, str],
    hint: str,
    files: dict[str, str],
    p: dict[str, Any] | None = None,
    tables: dict[str, Any] | None = None,
) -> _Rows:
    p = p or TaskParams().to_dict()
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
    return _Rows(columns, str(path), hint, None, original)


def _hub_rows(
    dataset: str,
    config: str | None,
    revision: str,
    split: str,
    global_renames: dict[str, str],
    label_column: str,
    files: dict[str, str],
) -> _Rows:
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
    return _Rows(columns, where, "finetune.task.columns", class_names, list(ds.column_names))


def _empty_rows(rows: _Rows, text_columns: list[str], task_type: str) -> np.ndarray:
    """Per row: True when a text column is empty, whitespace-only or null (token
    classification: the word list is null or has no words)."""
    empty = np.zeros(len(rows.columns[text_columns[0]]), dtype=bool)
    for c in text_columns:
        for i, v in enumerate(rows.columns[c]):
            if task_type == "token_classification":
                empty[i] |= (
                    v is None
                    or (isinstance(v, float) and np.isnan(v))
                    or (isinstance(v, (list, tuple, np.ndarray)) and len(v) == 0)
                )
            else:
                empty[i] |= not _text(v).strip()
    return empty


def _empty_text(text_columns: list[str], task_type: str) -> str:
    if task_type == "token_classification":
        return f"no words in {text_columns[0]!r}"
    return "empty text in " + " or ".join(repr(c) for c in text_columns)


def _missing(rows: _Rows, column: str, what: str, missing: np.ndarray, kept: int) -> BertraceError:
    return BertraceError(
        f"{rows.where}: column {column!r} has no {what} in {len(missing)} of {kept} data rows with text: "
        f"{_row_numbers(missing)}; fill in the {what} or delete those rows"
    )


def _labels(
    values: list, label_names: list[str], rows: _Rows, label_column: str, role: str, skip: np.ndarray
) -> torch.Tensor | None:
    """Label ids: ints index ``label_names``; strings are looked up in it (in NFC; digit strings
    may also be indices). Rows in ``skip`` (empty text) are not checked. Every kept row without a
    label (empty, null or -1) = an unlabelled split (GLUE's test): None; some = an error."""
    index = {name: i for i, name in enumerate(label_names)}
    out = np.full(len(values), -1, dtype=np.int64)
    bad: list[Any] = []
    for i, v in enumerate(values):
        if skip[i]:
            continue
        if isinstance(v, str):
            v = _nfc(v.strip())
            if not v:
                continue
            if v in index:
                out[i] = index[v]
                continue
            try:
                v = int(v)
            except ValueError:
                out[i] = -2
                bad.append(v)
                continue
        if v is None or (isinstance(v, float) and np.isnan(v)):
            continue
        if isinstance(v, (bool, np.bool_)) or not float(v).is_integer():
            out[i] = -2
            bad.append(v)
            continue
        v = int(v)
        out[i] = v if 0 <= v < len(label_names) or v == -1 else -2
        if out[i] == -2:
            bad.append(v)
    if bad:
        shown = sorted({repr(b) for b in bad})[:8]
        raise BertraceError(
            f"{rows.where}: column {label_column!r} has labels outside finetune.task.label_names "
            f"{label_names}: {', '.join(shown)} ({len(bad)} rows); list every label "
            f"in finetune.task.label_names (string labels by name, integer labels 0..{len(label_names) - 1})"
        )
    missing = np.flatnonzero((out == -1) & ~skip)
    kept = int((~skip).sum())
    if len(missing) == kept:
        if role != "test":
            raise BertraceError(
                f"{rows.where}: the {role} split has no labels (all -1 / empty); pick a labelled "
                f"split in finetune.task.splits.{role}"
            )
        return None
    if len(missing):
        raise _missing(rows, label_column, "label", missing, kept)
    return torch.from_numpy(out)


def _check_columns(rows: _Rows, needed: list[str]) -> None:
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


def load_task_data(
    params: dict | None,
    tokenizer,
    *,
    max_len: int,
    truncation: str = "head",
    mirror: str | os.PathLike | None = None,
    roles: Sequence[str] = ("train", "validation"),
    progress: bool = False,
    warn: Callable[[str], None] = _warn,
) -> TaskData:
    """Read, check, sample and tokenize the task splits named by ``roles``.

    ``params`` is ``finetune.task``; ``tokenizer`` a ``tokenizers.Tokenizer``; ``roles`` a subset
    of train / validation / test. ``mirror`` (a YAML index or a directory) replaces the hub.
    ``progress`` is accepted for symmetry with the other loaders (tokenizing is one fast
    ``encode_batch`` per split). ``warn`` gets one line per file with rows skipped for empty
    text (default: ``warning: ...`` on stderr). Raises BertraceError naming the file for a
    missing file or column, missing labels or labels outside ``label_names``, or an empty split.
    """
    p = task_params(params)
    text_columns, label_column = p["text_columns"], str(p["label_column"])
    label_names = [_nfc(str(n)) for n in (p["label_names"] or [])]
    twice = sorted({n for n in label_names if label_names.count(n) > 1})
    if twice:
        raise BertraceError(
            f"params.yaml: finetune.task.label_names lists {twice[0]!r} more than once (names are compared "
            "in Unicode NFC); list each label once"
        )
    global_renames = {str(k): str(v) for k, v in p["columns"].items()}
    files: dict[str, str] = {}
    tables: dict[str, Any] = {}  # csv/tsv file -> the delimiter and quoting it was read with
    roles = list(roles)
    bad_roles = [r for r in roles if r not in ROLES]
    if bad_roles:
        raise ValueError(f"unknown roles {bad_roles}; use {ROLES}")

    # Which source split serves each role; validation may be carved out of train.
    split_of = {r: p["splits"].get(r) for r in roles}
    carve = "validation" in roles and not split_of.get("validation")
    if carve:
        split_of.pop("validation")
        if "train" not in split_of:
            split_of["train"] = p["splits"].get("train")
    for role, split in split_of.items():
        if not split:
            raise BertraceError(
                f"params.yaml: finetune.task.splits.{role} is empty; name the split that serves as {role}"
                + (
                    " (or let the evaluate stage score only the task's roles: evaluate.splits: auto)"
                    if role == "test"
                    else ""
                )
            )
    wanted = sorted({str(s) for s in split_of.values()})

    rows_by_split: dict[str, _Rows] = {}
    if p["source"] == "local":
        for split in wanted:
            if split not in p["local"]:
                raise BertraceError(
                    f"params.yaml: finetune.task.local has no entry for split {split!r} (it has: "
                    f"{sorted(p['local'])}); add '{split}: path/to/file' or fix finetune.task.splits"
                )
            rel, renames = entry(p["local"][split], f"params.yaml: finetune.task.local.{split}")
            hint = f"finetune.task.local.{split}: {{path: ..., columns: {{old: new}}}}"
            rows_by_split[split] = _file_rows(
                Path(os.path.expanduser(rel)), renames, global_renames, hint, files, p, tables
            )
        source = {"type": "local", "files": {s: Path(entry(p["local"][s], "")[0]).as_posix() for s in wanted}}
    else:
        hub = p["hub"]
        dataset, config, revision = hub.get("dataset"), hub.get("config") or None, str(hub.get("revision") or "main")
        if not dataset:
            raise BertraceError(
                "params.yaml: finetune.task.hub.dataset is empty; name a hub dataset (e.g. nyu-mll/glue)"
            )
        source = {
            "type": "hub",
            "dataset": dataset,
            "config": config,
            "revision": revision,
            "mirror": str(mirror) if mirror else None,
        }
        if mirror:
            for split, (path, renames) in resolve_mirror_entries(mirror, dataset, config, wanted).items():
                hint = "a 'columns: {old: new}' map in the mirror entry or finetune.task.columns"
                rows_by_split[split] = _file_rows(path, renames, global_renames, hint, files, p, tables)
        else:
            pinned = resolve_revision(dataset, config, revision, key="finetune.task.hub")
            source["resolved_revision"] = pinned
            for split in wanted:
                rows_by_split[split] = _hub_rows(
                    dataset, config, pinned or revision, split, global_renames, label_column, files
                )

    if tables:
        source["tables"] = tables
    task_type = p["type"]
    label_source = "params.yaml: finetune.task.label_names"
    if not label_names and task_type != "regression":
        names = next((r.class_names for r in rows_by_split.values() if r.class_names), None)
        if not names and task_type == "token_classification":
            found = sorted(
                {
                    str(t)
                    for r in rows_by_split.values()
                    if label_column in r.columns
                    for seq in r.columns[label_column]
                    if isinstance(seq, (list, tuple, np.ndarray))
                    for t in seq
                }
            )
            raise BertraceError(
                f"params.yaml: finetune.task.label_names is empty; list the BIO tags in label order, "
                f"e.g. [O, B-X, I-X, ...] (the data has: {found[:40]})"
            )
        if not names:
            raise BertraceError(
                "params.yaml: finetune.task.label_names is empty; list the class names in label order "
                "(e.g. [negative, positive])"
            )
        label_names = [_nfc(str(n)) for n in names]
        label_source = next(r.where for r in rows_by_split.values() if r.class_names)
    if task_type == "token_classification":
        from pipeline.finetune.token_data import check_bio

        check_bio(label_names, label_source)

    needed = text_columns + [label_column]
    ordered = [r for r in ROLES if r in roles]
    # Rows with empty text, per source split: skipped in every role (one warning per file), before
    # the labels are checked, so a blank line is a skipped row and not a missing label.
    empty_of: dict[str, np.ndarray] = {}
    warned: set[str] = set()
    for role in ordered:
        split = str(split_of.get(role) or split_of["train"])
        rows = rows_by_split[split]
        _check_columns(rows, needed)
        n = len(rows.columns[label_column])
        if n == 0:
            raise BertraceError(
                f"{rows.where}: the {role} split ({split}) has no rows; point finetune.task.splits."
                f"{role} at a non-empty split or fix the file"
            )
        if split not in empty_of:
            empty_of[split] = _empty_rows(rows, text_columns, task_type)
            empty = np.flatnonzero(empty_of[split])
            what = _empty_text(text_columns, task_type)
            if len(empty) == n:
                raise BertraceError(
                    f"{rows.where}: all {n} data rows have {what}; fix the file or point "
                    f"finetune.task.splits.{role} at another split"
                )
            if len(empty) and rows.where not in warned:  # one line per file, whatever its roles
                warned.add(rows.where)
                warn(
                    f"{rows.where}: skipping {len(empty)} of {n} data rows with {what} (neither trained on "
                    f"nor scored): {_row_numbers(empty)}; fill in the "
                    f"{'words' if task_type == 'token_classification' else 'text'} or delete those rows"
                )

    splits: dict[str, TaskSplit] = {}
    for role in ordered:
        split = str(split_of.get(role) or split_of["train"])
        rows = rows_by_split[split]
        skip = empty_of[split]
        n = len(skip)
        if task_type == "token_classification":
            labels = _tag_labels(
                rows.columns[label_column],
                rows.columns[text_columns[0]],
                label_names,
                rows,
                label_column,
                text_columns[0],
                role,
                skip,
            )
        elif task_type == "regression":
            labels = _scores(rows.columns[label_column], rows, label_column, role, skip)
        else:
            labels = _labels(rows.columns[label_column], label_names, rows, label_column, role, skip)
        idx = np.arange(n)
        if carve and role in ("train", "validation"):
            frac = float(p["validation_fraction"])  # in (0, 1): TaskParams
            perm = np.random.default_rng([int(p.get("sample_seed") or 0), 99]).permutation(n)
            n_val = max(1, int(round(n * frac)))
            idx = np.sort(perm[:n_val] if role == "validation" else perm[n_val:])
        skipped = int(skip[idx].sum())
        idx = idx[~skip[idx]]
        limit = p["max_examples"].get(role)
        if limit and len(idx) > int(limit):
            # A random subset kept in file order; one RNG per role, so a role's subset is the same
            # whichever other roles are loaded with it (the evaluate stage loads only some).
            rng = np.random.default_rng([int(p.get("sample_seed") or 0), ROLES.index(role)])
            idx = np.sort(rng.permutation(idx)[: int(limit)])
        if len(idx) == 0:
            raise BertraceError(
                f"{rows.where}: the {role} split is empty after sampling"
                + (f" and skipping {skipped} rows with empty text" if skipped else "")
                + f"; raise finetune.task.max_examples.{role} or validation_fraction"
            )
        if task_type == "token_classification":
            splits[role] = _token_split(
                tokenizer, rows, text_columns[0], labels, idx, label_names, max_len, role, split, tables
            )
            splits[role].skipped = skipped
            continue
        texts = [[_text(rows.columns[c][i]) for i in idx] for c in text_columns]
        ids, types, n_cut = encode_examples(
            tokenizer, texts[0], texts[1] if len(texts) > 1 else None, max_len, truncation
        )
        splits[role] = TaskSplit(
            role,
            split,
            ids,
            types,
            None if labels is None else labels[torch.from_numpy(idx)],
            rows.where,
            n_cut,
            task_type,
            skipped=skipped,
        )
    return TaskData(splits, label_names, text_columns, label_column, max_len, truncation, files, source, task_type)


def _words(v: Any, rows: _Rows, column: str, i: int) -> list[str]:
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        raise BertraceError(
            f"{rows.where}: data row {i + 1} ({ROWS_CONVENTION}) of column {column!r} is {type(v).__name__}, "
            "not a list of words; token_classification reads a column of word lists (or a CoNLL file)"
        )
    return [_text(w) for w in v]


def _tag_labels(
    values: list,
    words: list,
    label_names: list[str],
    rows: _Rows,
    label_column: str,
    text_column: str,
    role: str,
    skip: np.ndarray,
) -> list[list[int]] | None:
    """Per example the word tag ids (ints index ``label_names``, strings are looked up in it, in
    NFC); the tag list must be as long as the word list. Rows in ``skip`` (no words) get no tags.
    Every kept row untagged = an unlabelled (test) split; some = an error."""
    index = {name: i for i, name in enumerate(label_names)}
    out: list[list[int]] = []
    bad: set[str] = set()
    n_bad = 0
    for i, (tags, ws) in enumerate(zip(values, words)):
        if skip[i]:
            out.append([])
            continue
        tags = [] if tags is None else (tags.tolist() if isinstance(tags, np.ndarray) else list(tags))
        n_words = len(_words(ws, rows, text_column, i))
        if tags and len(tags) != n_words:
            raise BertraceError(
                f"{rows.where}: data row {i + 1} ({ROWS_CONVENTION}) has {n_words} words in {text_column!r} but "
                f"{len(tags)} tags in {label_column!r}; each word needs exactly one tag"
            )
        ids = []
        for t in tags:
            if isinstance(t, str):
                k = index.get(_nfc(t.strip()), -1)
            elif isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_)):
                k = int(t) if 0 <= int(t) < len(label_names) else -1
            else:
                k = -1
            if k < 0:
                bad.add(repr(t))
                n_bad += 1
            ids.append(k)
        out.append(ids)
    if bad:
        raise BertraceError(
            f"{rows.where}: column {label_column!r} has tags outside finetune.task.label_names {label_names}: "
            f"{', '.join(sorted(bad)[:8])} ({n_bad} words); list every tag in finetune.task.label_names"
        )
    missing = np.flatnonzero([not ids and not skipped for ids, skipped in zip(out, skip)])
    kept = int((~skip).sum())
    if len(missing) == kept:
        if role != "test":
            raise BertraceError(
                f"{rows.where}: the {role} split has no tags; pick a labelled split in finetune.task.splits.{role}"
            )
        return None
    if len(missing):
        raise _missing(rows, label_column, "tags", missing, kept)
    return out


def _scores(values: list, rows: _Rows, label_column: str, role: str, skip: np.ndarray) -> torch.Tensor | None:
    """Regression targets as float32; rows in ``skip`` (empty text) are not checked. Every kept
    row empty / NaN = an unlabelled (test) split; some = an error."""
    out = np.full(len(values), np.nan, dtype=np.float64)
    bad: list[Any] = []
    for i, v in enumerate(values):
        if skip[i]:
            continue
        if isinstance(v, str):
            v = v.strip()
            if not v:
                continue
        try:
            out[i] = np.nan if v is None else float(v)
        except (TypeError, ValueError):
            bad.append(v)
    if bad:
        shown = sorted({repr(b) for b in bad})[:8]
        raise BertraceError(
            f"{rows.where}: column {label_column!r} must hold numbers for a regression task: "
            f"{', '.join(shown)} ({len(bad)} rows); fix the file or finetune.task.label_column"
        )
    missing = np.flatnonzero(np.isnan(out) & ~skip)
    kept = int((~skip).sum())
    if len(missing) == kept:
        if role != "test":
            raise BertraceError(
                f"{rows.where}: the {role} split has no scores; pick a labelled split in finetune.task.splits.{role}"
            )
        return None
    if len(missing):
        raise _missing(rows, label_column, "score", missing, kept)
    return torch.from_numpy(out.astype(np.float32))


def _token_split(
    tokenizer,
    rows: _Rows,
    text_column: str,
    labels: list[list[int]] | None,
    idx: np.ndarray,
    label_names: list[str],
    max_len: int,
    role: str,
    split: str,
    tables: dict[str, Any],
) -> TaskSplit:
    from pipeline.finetune.token_data import bio_violations, encode_words

    words = [_words(rows.columns[text_column][i], rows, text_column, int(i)) for i in idx]
    word_labels = None if labels is None else [labels[i] for i in idx]
    enc = encode_words(tokenizer, words, word_labels, max_len)
    violations = 0 if word_labels is None else bio_violations([[label_names[t] for t in s] for s in word_labels])
    multi = int((tables.get(Path(rows.where).as_posix()) or {}).get("multi_tags") or 0)
    return TaskSplit(
        role,
        split,
        enc["input_ids"],
        enc["token_type_ids"],
        enc["labels"],
        rows.where,
        enc["truncated"],
        "token_classification",
        word_labels,
        enc["first"],
        words,
        violations,
        multi,
    )


def evaluate_roles(params: dict | None, splits: Any) -> list[str]:
    """The roles the evaluate stage scores: ``splits`` when it is a list, else (``auto``) validation
    (carved from train when ``finetune.task.splits.validation`` is null, as fine-tuning did) and
    test when ``finetune.task.splits.test`` names a split."""
    if splits != "auto":
        return list(splits)
    p = task_params(params)
    return ["validation"] + (["test"] if p["splits"].get("test") else [])


def _text(v: Any) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return ""
    return v if isinstance(v, str) else str(v)


__all__ = [
    "TaskSplit",
    "TaskData",
    "load_task_data",
    "task_params",
    "collate_task_batch",
    "encode_examples",
    "cut",
    "head_tail_split",
    "pair_budget",
    "read_table",
    "read_headerless",
    "csv_dialect",
    "evaluate_roles",
    "TaskParams",
    "TASK_TYPES",
    "IGNORE_INDEX",
]
