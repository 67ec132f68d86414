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

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal, Sequence

import numpy as np
import torch
from pydantic import BeforeValidator, Field, field_validator, model_validator

from pipeline.core.config import Float, Int, Section, Str
from pipeline.core.errors import BertraceError
from pipeline.data.hub import entry, resolve_mirror_entries, resolve_revision
from pipeline.finetune.task_files import (
    Rows,
    check_columns,
    file_rows,
    hub_rows,
    nfc,
    print_warning,
    row_numbers,
)
from pipeline.finetune.tasks.base import TaskType
from pipeline.finetune.tasks.registry import choices, get, names

ROLES = ("train", "validation", "test")


def _name(value: Any) -> Any:
    """A label name as text (YAML reads ``[0, 1]`` as numbers)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


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

    type: Str = "classification"  # a registered task type: pipeline/finetune/tasks/registry.py
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

    @field_validator("type", mode="before")
    @classmethod
    def _registered(cls, v):
        if not isinstance(v, str) or v not in names():
            raise ValueError(f"input should be {choices()}")
        return v

    @model_validator(mode="after")
    def _per_type(self) -> "TaskParams":
        get(self.type).check_params(self)
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

    @property
    def task(self) -> TaskType:
        return get(self.task_type)

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int):
        return self.input_ids[i], self.token_type_ids[i], self.task.item_label(self, i)

    def label_counts(self, num_labels: int) -> list[int]:
        return self.task.label_counts(self, num_labels)


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
    def task(self) -> TaskType:
        return get(self.task_type)

    @property
    def num_labels(self) -> int:
        """Outputs of the model's head (one for regression, else one per label name)."""
        return self.task.num_outputs(self.label_names)

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


def task_params(params: "TaskParams | dict | None") -> dict[str, Any]:
    """``finetune.task`` checked (:class:`TaskParams`) and as plain values, every key filled in."""
    if not isinstance(params, TaskParams):
        params = TaskParams.from_params(params)
    return params.to_dict()


def _split_of(p: dict[str, Any], roles: list[str]) -> tuple[dict[str, Any], bool]:
    """Which source split serves each role, and whether validation is carved out of train."""
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
    return split_of, carve


def _local_rows(p: dict[str, Any], wanted: list[str], global_renames, files, tables) -> tuple[dict, dict]:
    """``source: local``: each wanted split's file (``finetune.task.local``)."""
    rows_by_split: dict[str, Rows] = {}
    for split in wanted:
        if split not in p["local"]:
            raise BertraceError(
                f"params.yaml: finetune.task.local has no entry for split {split!r} (it has: "
                f"{sorted(p['local'])}); add '{split}: path/to/file' or fix finetune.task.splits"
            )
        rel, renames = entry(p["local"][split], f"params.yaml: finetune.task.local.{split}")
        hint = f"finetune.task.local.{split}: {{path: ..., columns: {{old: new}}}}"
        rows_by_split[split] = file_rows(Path(os.path.expanduser(rel)), renames, global_renames, hint, files, p, tables)
    source = {"type": "local", "files": {s: Path(entry(p["local"][s], "")[0]).as_posix() for s in wanted}}
    return rows_by_split, source


def _hub_rows(p: dict[str, Any], wanted: list[str], mirror, global_renames, files, tables) -> tuple[dict, dict]:
    """``source: hub``: each wanted split from the hub, or its local copy in ``mirror``."""
    hub = p["hub"]
    dataset, config, revision = hub.get("dataset"), hub.get("config") or None, str(hub.get("revision") or "main")
    if not dataset:
        raise BertraceError("params.yaml: finetune.task.hub.dataset is empty; name a hub dataset (e.g. nyu-mll/glue)")
    source = {
        "type": "hub",
        "dataset": dataset,
        "config": config,
        "revision": revision,
        "mirror": str(mirror) if mirror else None,
    }
    rows_by_split: dict[str, Rows] = {}
    if mirror:
        for split, (path, renames) in resolve_mirror_entries(mirror, dataset, config, wanted).items():
            hint = "a 'columns: {old: new}' map in the mirror entry or finetune.task.columns"
            rows_by_split[split] = file_rows(path, renames, global_renames, hint, files, p, tables)
    else:
        pinned = resolve_revision(dataset, config, revision, key="finetune.task.hub")
        source["resolved_revision"] = pinned
        label_column = str(p["label_column"])
        for split in wanted:
            rows_by_split[split] = hub_rows(
                dataset, config, pinned or revision, split, global_renames, label_column, files
            )
    return rows_by_split, source


def _label_names(
    task: TaskType, label_names: list[str], rows_by_split: dict[str, Rows], label_column: str
) -> list[str]:
    """``finetune.task.label_names``, else the source's class names (a hub ClassLabel), checked."""
    label_source = "params.yaml: finetune.task.label_names"
    if not label_names and task.has_label_names:
        names = next((r.class_names for r in rows_by_split.values() if r.class_names), None)
        if not names:
            raise task.missing_label_names(rows_by_split, label_column)
        label_names = [nfc(str(n)) for n in names]
        label_source = next(r.where for r in rows_by_split.values() if r.class_names)
    task.check_label_names(label_names, label_source)
    return label_names


def _empty_rows(task: TaskType, p, ordered, split_of, rows_by_split, warn) -> dict[str, np.ndarray]:
    """Rows with empty text, per source split: skipped in every role (one warning per file), found
    before the labels are checked, so a blank line is a skipped row and not a missing label."""
    text_columns, label_column = p["text_columns"], str(p["label_column"])
    empty_of: dict[str, np.ndarray] = {}
    warned: set[str] = set()
    for role in ordered:
        split = str(split_of.get(role) or split_of["train"])
        rows = rows_by_split[split]
        check_columns(rows, text_columns + [label_column])
        n = len(rows.columns[label_column])
        if n == 0:
            raise BertraceError(
                f"{rows.where}: the {role} split ({split}) has no rows; point finetune.task.splits."
                f"{role} at a non-empty split or fix the file"
            )
        if split in empty_of:
            continue
        empty_of[split] = task.empty_rows(rows, text_columns)
        empty = np.flatnonzero(empty_of[split])
        what = task.empty_text(text_columns)
        if len(empty) == n:
            raise BertraceError(
                f"{rows.where}: all {n} data rows have {what}; fix the file or point "
                f"finetune.task.splits.{role} at another split"
            )
        if len(empty) and rows.where not in warned:  # one line per file, whatever its roles
            warned.add(rows.where)
            warn(
                f"{rows.where}: skipping {len(empty)} of {n} data rows with {what} (neither trained on "
                f"nor scored): {row_numbers(empty)}; fill in the {task.fill_what} or delete those rows"
            )
    return empty_of


def _role_rows(p: dict[str, Any], role: str, skip: np.ndarray, carve: bool, rows: Rows) -> tuple[np.ndarray, int]:
    """The kept row indices of ``role`` (carved, empty rows dropped, sampled) and how many were skipped."""
    n = len(skip)
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
    return idx, skipped


def _checked_label_names(p: dict[str, Any]) -> list[str]:
    label_names = [nfc(str(n)) for n in (p["label_names"] or [])]
    twice = sorted({n for n in label_names if label_names.count(n) > 1})
    if twice:
        raise BertraceError(
            f"params.yaml: finetune.task.label_names lists {twice[0]!r} more than once (names are compared "
            "in Unicode NFC); list each label once"
        )
    return label_names


def load_task_data(
    params: dict | None,
    tokenizer,
    *,
    max_len: int,
    truncation: str = "head",
    mirror: str | os.PathLike | None = None,
    roles: Sequence[str] = ("train", "validation"),
    progress: bool = False,
    warn: Callable[[str], None] = print_warning,
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
    task = get(p["type"])
    text_columns, label_column = p["text_columns"], str(p["label_column"])
    label_names = _checked_label_names(p)
    global_renames = {str(k): str(v) for k, v in p["columns"].items()}
    files: dict[str, str] = {}
    tables: dict[str, Any] = {}  # csv/tsv file -> the delimiter and quoting it was read with
    roles = list(roles)
    bad_roles = [r for r in roles if r not in ROLES]
    if bad_roles:
        raise ValueError(f"unknown roles {bad_roles}; use {ROLES}")
    split_of, carve = _split_of(p, roles)
    wanted = sorted({str(s) for s in split_of.values()})
    read = _local_rows if p["source"] == "local" else functools.partial(_hub_rows, mirror=mirror)
    rows_by_split, source = read(p, wanted, global_renames=global_renames, files=files, tables=tables)
    if tables:
        source["tables"] = tables
    label_names = _label_names(task, label_names, rows_by_split, label_column)
    ordered = [r for r in ROLES if r in roles]
    empty_of = _empty_rows(task, p, ordered, split_of, rows_by_split, warn)
    ctx = {"label_names": label_names, "max_len": max_len, "truncation": truncation, "tables": tables}
    splits: dict[str, TaskSplit] = {}
    for role in ordered:
        split = str(split_of.get(role) or split_of["train"])
        rows = rows_by_split[split]
        skip = empty_of[split]
        labels = task.read_labels(rows, text_columns, label_column, label_names, role, skip)
        idx, skipped = _role_rows(p, role, skip, carve, rows)
        fields = task.encode(tokenizer, rows, text_columns, labels, idx, ctx)
        splits[role] = TaskSplit(role, split, source=rows.where, task_type=task.name, skipped=skipped, **fields)
    return TaskData(splits, label_names, text_columns, label_column, max_len, truncation, files, source, task.name)


def evaluate_roles(params: dict | None, splits: Any) -> list[str]:
    """The roles the evaluate stage scores: ``splits`` when it is a list, else (``auto``) validation
    (carved from train when ``finetune.task.splits.validation`` is null, as fine-tuning did) and
    test when ``finetune.task.splits.test`` names a split."""
    if splits != "auto":
        return list(splits)
    p = task_params(params)
    return ["validation"] + (["test"] if p["splits"].get("test") else [])


__all__ = [
    "TaskSplit",
    "TaskData",
    "load_task_data",
    "task_params",
    "evaluate_roles",
    "TaskParams",
    "ROLES",
]
