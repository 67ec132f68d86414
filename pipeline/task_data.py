"""Classification task data for fine-tuning: rows from the hub (or its mirror) or local files,
turned into WordPiece ids.

A task is described by the ``finetune.task`` params section:

* ``source: hub`` loads ``hub.dataset``/``hub.config`` (default GLUE SST-2, ``nyu-mll/glue`` /
  ``sst2``) with ``datasets.load_dataset``; with a hub mirror (``BERTRACE_HUB_MIRROR`` or
  ``finetune.mirror``, see :mod:`pipeline.hub`) the local copies are read
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

Sequences are ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` (run_classifier.py
``convert_single_example``), cut to ``max_len`` by ``head`` (keep the start) or ``head_tail``
(keep the start and the end: Sun et al. 2019, "How to Fine-Tune BERT for Text
Classification?", section 5.3.1, best on IMDB with 128 head + 382 tail tokens of 512).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from pipeline.errors import BertraceError
from pipeline.formats import CLS_ID, PAD_ID, SEP_ID
from pipeline.hub import entry, load_split, resolve_mirror_entries, resolve_revision
from pipeline.io import sha256_file

ROLES = ("train", "validation", "test")
TRUNCATIONS = ("head", "head_tail")
FILE_SUFFIXES = (".tsv", ".csv", ".parquet", ".jsonl", ".json")
DEFAULT_TASK: dict[str, Any] = {
    "source": "hub",
    "hub": {"dataset": "nyu-mll/glue", "config": "sst2", "revision": "main"},
    "local": {},
    "columns": {},
    "text_columns": ["sentence"],
    "label_column": "label",
    "label_names": ["negative", "positive"],
    "splits": {"train": "train", "validation": "validation", "test": "test"},
    "validation_fraction": 0.1,
    "max_examples": {"train": None, "validation": None, "test": None},
    "sample_seed": 0,
    "delimiter": "auto",
    "quoting": "auto",
}
QUOTINGS = {"minimal": csv.QUOTE_MINIMAL, "none": csv.QUOTE_NONE}
SNIFF_DELIMITERS = ",;\t|"


# ---------------------------------------------------------------------------------------------
# Tokenized data
# ---------------------------------------------------------------------------------------------
@dataclass
class TaskSplit(torch.utils.data.Dataset):
    """One tokenized split: unpadded id lists (padded per batch by :func:`collate`)."""

    role: str  # train | validation | test
    split: str  # the split's name at the source
    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    labels: torch.Tensor | None  # int64 [N]; None when the split is unlabelled (GLUE's test)
    source: str  # file path or hub id, for messages
    truncated: int = 0  # examples cut to max_len

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int):
        label = -100 if self.labels is None else int(self.labels[i])
        return self.input_ids[i], self.token_type_ids[i], label

    def label_counts(self, num_labels: int) -> list[int]:
        if self.labels is None:
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

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def task_info(self) -> dict[str, Any]:
        """The ``task`` entry of the fine-tuned checkpoint (SPEC), plus where the data came from."""
        return {"text_columns": list(self.text_columns), "max_len": self.max_len, "truncation": self.truncation,
                "label_column": self.label_column, "source": self.source,
                "splits": {r: s.split for r, s in self.splits.items()}}


def collate(batch: Sequence[tuple[list[int], list[int], int]]) -> dict[str, torch.Tensor]:
    """Pad a list of ``(input_ids, token_type_ids, label)`` to the batch's longest sequence."""
    T = max(len(ids) for ids, _, _ in batch)
    input_ids = torch.full((len(batch), T), PAD_ID, dtype=torch.long)
    token_type_ids = torch.zeros((len(batch), T), dtype=torch.long)
    attention_mask = torch.zeros((len(batch), T), dtype=torch.long)
    for i, (ids, types, _) in enumerate(batch):
        n = len(ids)
        input_ids[i, :n] = torch.tensor(ids)
        token_type_ids[i, :n] = torch.tensor(types)
        attention_mask[i, :n] = 1
    labels = torch.tensor([label for _, _, label in batch], dtype=torch.long)
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask,
            "labels": labels}


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
    return ids[:h] + ids[len(ids) - (n - h):]


def pair_budget(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Google's ``_truncate_seq_pair``: shorten the longer segment one token at a time
    (ties: B, i.e. the one popped in run_classifier.py when A is not longer)."""
    while len_a + len_b > budget:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


def encode_examples(tokenizer, texts_a: list[str], texts_b: list[str] | None, max_len: int,
                    truncation: str = "head") -> tuple[list[list[int]], list[list[int]], int]:
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


def task_params(params: dict | None) -> dict[str, Any]:
    """``finetune.task`` with defaults filled in (nested ``hub``/``splits`` merged)."""
    params = dict(params or {})
    unknown = sorted(str(k) for k in params if k not in DEFAULT_TASK)
    if unknown:
        raise BertraceError(f"params.yaml: finetune.task.{unknown[0]}: unknown key; valid keys: "
                            f"{', '.join(sorted(DEFAULT_TASK))} (a typo? fix it in params.yaml)")
    out = {**DEFAULT_TASK, **params}
    out["hub"] = {**DEFAULT_TASK["hub"], **(params.get("hub") or {})}
    out["splits"] = {**DEFAULT_TASK["splits"], **(params.get("splits") or {})}
    out["columns"] = dict(params.get("columns") or {})
    out["local"] = dict(params.get("local") or {})
    out["max_examples"] = dict(params.get("max_examples") or {})
    text_columns = out["text_columns"]
    if isinstance(text_columns, str):
        text_columns = [text_columns]
    if not text_columns or len(text_columns) > 2:
        raise BertraceError(f"params.yaml: finetune.task.text_columns is {out['text_columns']!r}; name one column "
                            "(single sentence) or two (sentence pair)")
    out["text_columns"] = [str(c) for c in text_columns]
    if out["source"] not in ("hub", "local"):
        raise BertraceError(f"params.yaml: finetune.task.source is {out['source']!r}; use 'hub' or 'local'")
    delimiter = out["delimiter"]
    if not (delimiter == "auto" or (isinstance(delimiter, str) and len(delimiter) == 1 and delimiter not in "\"\r\n")):
        raise BertraceError(f"params.yaml: finetune.task.delimiter = {delimiter!r}: use auto or one character, e.g. "
                            "';' or \"\\t\" (double quotes in YAML for a tab)")
    if out["quoting"] not in ("auto", *QUOTINGS):
        raise BertraceError(f"params.yaml: finetune.task.quoting = {out['quoting']!r}: use auto, minimal (standard "
                            "double quotes) or none")
    return out


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


def read_table(path: Path, *, delimiter: str = "auto", quoting: str = "auto",
               dialect: dict[str, Any] | None = None) -> dict[str, list]:
    """Columns of a ``.tsv`` / ``.csv`` / ``.parquet`` / ``.jsonl`` file (first line = header
    for tsv/csv; CRLF line endings are fine). ``dialect`` (if given) receives what
    :func:`csv_dialect` chose for a csv/tsv file."""
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
            df = pd.read_csv(path, sep=chosen["delimiter"], dtype=str, keep_default_na=False, encoding="utf-8",
                             quoting=QUOTINGS[chosen["quoting"]])
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
            how = (f" with delimiter {chosen['delimiter']!r}{' (sniffed)' if chosen['sniffed'] else ''} and quoting "
                   f"{chosen['quoting']}; set finetune.task.delimiter / finetune.task.quoting, or")
        raise BertraceError(f"{path}: cannot be read as {suffix[1:]}{how} ({type(e).__name__}: "
                            f"{' '.join(str(e).split())[:200]}); fix or replace the file") from None
    raise BertraceError(f"{path}: unsupported file type {suffix or '(none)'}; use one of {list(FILE_SUFFIXES)}")


def _rename(columns: dict[str, list], renames: dict[str, str]) -> dict[str, list]:
    return {renames.get(c, c): v for c, v in columns.items()}


def _file_rows(path: Path, renames: dict[str, str], global_renames: dict[str, str], hint: str,
               files: dict[str, str], p: dict[str, Any] | None = None, tables: dict[str, Any] | None = None) -> _Rows:
    p = p or DEFAULT_TASK
    dialect: dict[str, Any] = {}
    columns = read_table(path, delimiter=p["delimiter"], quoting=p["quoting"], dialect=dialect)
    if dialect and tables is not None:
        tables[path.as_posix()] = dialect
    files[path.as_posix()] = sha256_file(path)
    original = list(columns)
    columns = _rename(_rename(columns, renames), global_renames)
    return _Rows(columns, str(path), hint, None, original)


def _hub_rows(dataset: str, config: str | None, revision: str, split: str, global_renames: dict[str, str],
              label_column: str, files: dict[str, str]) -> _Rows:
    where = f"hub dataset {dataset}{'/' + config if config else ''} split {split}"
    ds = load_split(dataset, config, revision, split, key="finetune.task.hub")
    original_label = next((old for old, new in global_renames.items() if new == label_column), label_column)
    label_feature = ds.features.get(original_label)
    class_names = list(getattr(label_feature, "names", []) or []) or None
    files[f"hub:{dataset}/{config}/{split}@{revision}"] = ds._fingerprint
    columns = _rename(ds.to_dict(), global_renames)
    return _Rows(columns, where, "finetune.task.columns", class_names, list(ds.column_names))


def _labels(values: list, label_names: list[str], rows: _Rows, label_column: str, role: str) -> torch.Tensor | None:
    """Label ids: ints index ``label_names``; strings are looked up in it (digit strings may
    also be indices). All -1 / empty = an unlabelled split (GLUE's test): None."""
    index = {name: i for i, name in enumerate(label_names)}
    out = np.empty(len(values), dtype=np.int64)
    bad: list[Any] = []
    for i, v in enumerate(values):
        if isinstance(v, str):
            v = v.strip()
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
            out[i] = -1
            continue
        if isinstance(v, (bool, np.bool_)) or not float(v).is_integer():
            out[i] = -2
            bad.append(v)
            continue
        v = int(v)
        out[i] = v if 0 <= v < len(label_names) or v == -1 else -2
        if out[i] == -2:
            bad.append(v)
    if bad or ((out == -1).any() and not (out == -1).all()):
        shown = sorted({repr(b) for b in bad})[:8] or ["-1 / empty"]
        raise BertraceError(
            f"{rows.where}: column {label_column!r} has labels outside finetune.task.label_names "
            f"{label_names}: {', '.join(shown)} ({len(bad) or int((out == -1).sum())} rows); list every label "
            f"in finetune.task.label_names (string labels by name, integer labels 0..{len(label_names) - 1})")
    if (out == -1).all():
        if role != "test":
            raise BertraceError(f"{rows.where}: the {role} split has no labels (all -1 / empty); pick a labelled "
                                f"split in finetune.task.splits.{role}")
        return None
    return torch.from_numpy(out)


def _check_columns(rows: _Rows, needed: list[str]) -> None:
    missing = [c for c in needed if c not in rows.columns]
    if missing:
        renamed = f" (after renames; in the file: {rows.original_columns})" if rows.original_columns != list(rows.columns) else ""
        raise BertraceError(
            f"{rows.where}: no column {missing[0]!r}; columns present: {list(rows.columns)}{renamed}. Set "
            f"finetune.task.text_columns / finetune.task.label_column to the right names, or rename columns "
            f"with {rows.hint}")


def load_task_data(params: dict | None, tokenizer, *, max_len: int, truncation: str = "head",
                   mirror: str | os.PathLike | None = None, roles: Sequence[str] = ("train", "validation"),
                   progress: bool = False) -> TaskData:
    """Read, check, sample and tokenize the task splits named by ``roles``.

    ``params`` is ``finetune.task``; ``tokenizer`` a ``tokenizers.Tokenizer``; ``roles`` a subset
    of train / validation / test. ``mirror`` (a YAML index or a directory) replaces the hub.
    ``progress`` is accepted for symmetry with the other loaders (tokenizing is one fast
    ``encode_batch`` per split). Raises BertraceError naming the file for a missing file or
    column, labels outside ``label_names`` or an empty split.
    """
    p = task_params(params)
    text_columns, label_column = p["text_columns"], str(p["label_column"])
    label_names = [str(n) for n in (p["label_names"] or [])]
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
            raise BertraceError(f"params.yaml: finetune.task.splits.{role} is empty; name the split that serves as {role}"
                                + (" (or let the evaluate stage score only the task's roles: evaluate.splits: auto)"
                                   if role == "test" else ""))
    wanted = sorted({str(s) for s in split_of.values()})

    rows_by_split: dict[str, _Rows] = {}
    if p["source"] == "local":
        for split in wanted:
            if split not in p["local"]:
                raise BertraceError(f"params.yaml: finetune.task.local has no entry for split {split!r} (it has: "
                                    f"{sorted(p['local'])}); add '{split}: path/to/file' or fix finetune.task.splits")
            rel, renames = entry(p["local"][split], f"params.yaml: finetune.task.local.{split}")
            hint = f"finetune.task.local.{split}: {{path: ..., columns: {{old: new}}}}"
            rows_by_split[split] = _file_rows(Path(os.path.expanduser(rel)), renames, global_renames, hint, files,
                                              p, tables)
        source = {"type": "local", "files": {s: Path(entry(p["local"][s], "")[0]).as_posix() for s in wanted}}
    else:
        hub = p["hub"]
        dataset, config, revision = hub.get("dataset"), hub.get("config") or None, str(hub.get("revision") or "main")
        if not dataset:
            raise BertraceError("params.yaml: finetune.task.hub.dataset is empty; name a hub dataset (e.g. nyu-mll/glue)")
        source = {"type": "hub", "dataset": dataset, "config": config, "revision": revision,
                  "mirror": str(mirror) if mirror else None}
        if mirror:
            for split, (path, renames) in resolve_mirror_entries(mirror, dataset, config, wanted).items():
                hint = "a 'columns: {old: new}' map in the mirror entry or finetune.task.columns"
                rows_by_split[split] = _file_rows(path, renames, global_renames, hint, files, p, tables)
        else:
            pinned = resolve_revision(dataset, config, revision, key="finetune.task.hub")
            source["resolved_revision"] = pinned
            for split in wanted:
                rows_by_split[split] = _hub_rows(dataset, config, pinned or revision, split, global_renames,
                                                 label_column, files)

    if tables:
        source["tables"] = tables
    if not label_names:
        names = next((r.class_names for r in rows_by_split.values() if r.class_names), None)
        if not names:
            raise BertraceError("params.yaml: finetune.task.label_names is empty; list the class names in label order "
                                "(e.g. [negative, positive])")
        label_names = names

    needed = text_columns + [label_column]
    splits: dict[str, TaskSplit] = {}
    for role in [r for r in ROLES if r in roles]:
        split = str(split_of.get(role) or split_of["train"])
        rows = rows_by_split[split]
        _check_columns(rows, needed)
        n = len(rows.columns[label_column])
        if n == 0:
            raise BertraceError(f"{rows.where}: the {role} split ({split}) has no rows; point finetune.task.splits."
                                f"{role} at a non-empty split or fix the file")
        labels = _labels(rows.columns[label_column], label_names, rows, label_column, role)
        idx = np.arange(n)
        if carve and role in ("train", "validation"):
            frac = float(p["validation_fraction"])
            if not 0.0 < frac < 1.0:
                raise BertraceError("params.yaml: finetune.task.validation_fraction must be in (0, 1) when "
                                    "finetune.task.splits.validation is null")
            perm = np.random.default_rng([int(p.get("sample_seed") or 0), 99]).permutation(n)
            n_val = max(1, int(round(n * frac)))
            idx = np.sort(perm[:n_val] if role == "validation" else perm[n_val:])
        limit = p["max_examples"].get(role)
        if limit and len(idx) > int(limit):
            # A random subset kept in file order; one RNG per role, so a role's subset is the same
            # whichever other roles are loaded with it (the evaluate stage loads only some).
            rng = np.random.default_rng([int(p.get("sample_seed") or 0), ROLES.index(role)])
            idx = np.sort(rng.permutation(idx)[: int(limit)])
        if len(idx) == 0:
            raise BertraceError(f"{rows.where}: the {role} split is empty after sampling; raise "
                                f"finetune.task.max_examples.{role} or validation_fraction")
        texts = [[_text(rows.columns[c][i]) for i in idx] for c in text_columns]
        ids, types, n_cut = encode_examples(tokenizer, texts[0], texts[1] if len(texts) > 1 else None,
                                            max_len, truncation)
        splits[role] = TaskSplit(role, split, ids, types, None if labels is None else labels[torch.from_numpy(idx)],
                                 rows.where, n_cut)
    return TaskData(splits, label_names, text_columns, label_column, max_len, truncation, files, source)


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


__all__ = ["TaskSplit", "TaskData", "load_task_data", "task_params", "collate", "encode_examples", "cut",
           "head_tail_split", "pair_budget", "read_table", "csv_dialect", "evaluate_roles", "DEFAULT_TASK"]
