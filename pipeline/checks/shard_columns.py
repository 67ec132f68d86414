"""Reading one examples shard for its checks: the file-level checks (present, sha256 as in the
manifest, readable Parquet), the column types of docs/formats.md, and the per-row numbers of an
Arrow list column computed from its offsets (vectorised: memory stays bounded by one shard).
Shared by the MLM / NSP and packed shard suites (:mod:`pipeline.checks.validate`, :mod:`pipeline.checks.validate_packed`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from pipeline.checks.report import CheckResult, failed_check
from pipeline.core.io import sha256_file

_TYPES = {
    "token_type_ids": ("list", {"uint8"}),
    "next_sentence_label": ("scalar", {"int8"}),
    "masked_lm_positions": ("list", {"uint16"}),
}


def schema_problems(table, spec) -> tuple[list[str], bool]:
    """Differences from the Parquet types of docs/formats.md, and whether the columns are usable at all
    (``spec``: the manifest's promise, with ``columns`` and ``vocab_size``)."""
    import pyarrow as pa

    id_types = {"uint16", "uint32"} if spec.vocab_size <= 65536 else {"uint32"}
    problems, usable = [], True
    for name in spec.columns:
        typ = table.schema.field(name).type
        kind, allowed = _TYPES.get(name, ("list", id_types))
        if kind == "list":
            if not (pa.types.is_list(typ) or pa.types.is_large_list(typ)):
                problems.append(f"{name}: {typ}, expected list<{'|'.join(sorted(allowed))}>")
                usable = False
                continue
            typ = typ.value_type
        if not pa.types.is_integer(typ):
            usable = False
        if str(typ) not in allowed:
            problems.append(
                f"{name}: {table.schema.field(name).type}, expected "
                + (f"list<{'|'.join(sorted(allowed))}>" if kind == "list" else "|".join(sorted(allowed)))
            )
    return problems, usable


def open_shard(path: Path, entry: dict) -> tuple[list[CheckResult], Any]:
    """The file-level checks of one listed shard (present, sha256 as in manifest.json, readable
    Parquet) and its table (None when a check stops it); shared by the MLM and packed suites."""
    import pyarrow.parquet as pq

    target = str(path)
    if not path.is_file():
        return [
            failed_check(
                target, "shard_exists", f"{path}: listed in manifest.json but missing; rerun the examples stage"
            )
        ], None
    actual = sha256_file(path)
    results = [
        CheckResult(
            target,
            "sha256_matches_manifest",
            actual == entry["sha256"],
            {"manifest": entry["sha256"], "actual": actual},
            0,
            [],
            "file sha256 matches manifest.json"
            if actual == entry["sha256"]
            else f"{path}: sha256 differs from manifest.json (modified after the examples stage?); "
            "rerun the examples stage",
        )
    ]
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for corrupt files
        results.append(
            failed_check(
                target,
                "parquet_readable",
                f"{path}: cannot read as Parquet ({type(e).__name__}: {e}); delete it and rerun the examples stage",
            )
        )
        return results, None
    return results, table


def check_structure(
    path: Path, entry: dict, spec, columns_suite, columns_message: Callable[[Any, CheckResult], str]
) -> tuple[list[CheckResult], Any]:
    """The checks every shard kind starts with: the file against its manifest entry (:func:`open_shard`),
    the column names (the Great Expectations ``columns_suite``; ``columns_message(table, check)`` says
    what is wrong) and the column types (:func:`schema_problems`). ``(results, table)``; the table is
    None when the row checks cannot run."""
    import pandas as pd

    from pipeline.checks.gx import to_check

    target = str(path)
    results, table = open_shard(path, entry)
    if table is None:
        return results, None
    (r,) = columns_suite.run(pd.DataFrame(columns=table.column_names), run_name=target)
    check = to_check(r, target)
    results.append(check)
    if not check.success:
        check.message = columns_message(table, check)
        return results, None
    problems, usable = schema_problems(table, spec)
    types = {f.name: str(f.type) for f in table.schema}
    results.append(
        CheckResult(
            target,
            "parquet_column_types",
            not problems,
            types,
            len(problems),
            [{"column": p} for p in problems],
            "column types as in the spec"
            if not problems
            else f"{path}: column types differ from the spec: " + "; ".join(problems),
        )
    )
    return results, table if usable else None


def list_column_arrays(column) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(offsets, values, nulls per row)`` of an Arrow list column, offsets starting at 0."""
    import pyarrow as pa

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = arr.values.slice(offsets[0], offsets[-1] - offsets[0])
    offsets = offsets - offsets[0]
    nulls = np.asarray(arr.is_null(), dtype=np.int64)
    if values.null_count:
        nulls = nulls + segment_sum(np.asarray(values.is_null()), offsets)
    if values.null_count:
        values = values.fill_null(0)
    return offsets, values.to_numpy(zero_copy_only=False), nulls


def segment_sum(flags: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per-row sum of ``flags`` over the rows delimited by ``offsets`` (empty rows give 0)."""
    cs = np.zeros(len(flags) + 1, dtype=np.int32 if len(flags) < 2**31 else np.int64)
    np.cumsum(flags, out=cs[1:])
    return cs[offsets[1:]].astype(np.int64) - cs[offsets[:-1]]


def segment_max(values: np.ndarray, offsets: np.ndarray):
    """Per-row max as a nullable integer array (missing for empty rows; GX skips missing values)."""
    lengths = np.diff(offsets)
    nonempty = lengths > 0
    out = np.zeros(len(lengths), dtype=np.int64)
    if nonempty.any():
        out[nonempty] = np.maximum.reduceat(values, offsets[:-1][nonempty])
    return nullable_ints(out, ~nonempty)


def nullable_ints(values: np.ndarray, missing: np.ndarray):
    import pandas as pd

    return pd.arrays.IntegerArray(values.astype(np.int64), missing)
