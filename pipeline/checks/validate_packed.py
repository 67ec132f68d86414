"""Great Expectations suite for packed causal-LM shards (``examples.mode: causal``, :mod:`pipeline.data.packing`).

:func:`pipeline.checks.validate.validate_shards` hands a manifest with ``mode: causal`` to
:func:`validate_packed_shards`, which checks, with real GX expectations on per-row facts computed
vectorised from each shard's Arrow arrays (the plumbing of :mod:`pipeline.checks.validate`):

* per shard: sha256 and row count against the manifest; columns exactly ``[input_ids]`` as
  ``list<uint16|uint32>``; every block exactly ``max_seq_len`` tokens; no nulls; every id
  ``< vocab_size``; no ``[PAD]`` (blocks are never padded); separator placement: no ``[SEP]``
  right after another ``[SEP]`` (across block boundaries too: a shard's blocks are one stream) nor
  at the start of a shard, which would mean an empty document;
* per split: rows, tokens and separators (summed per shard) against the manifest (each packed document ends with one
  ``[SEP]``, so a lost or duplicated separator shows up here);
* across all shards of both splits: no two blocks alike (a 16-byte blake2b per block), so no shard
  overlaps another and train and valid share no block.

What is *not* checkable from the shards alone: where a block begins in its document (blocks cut
the stream anywhere, so the first token of a block may be a ``[SEP]`` or the middle of a word).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.checks.gx import GX, to_check
from pipeline.checks.report import CheckResult, ValidationReport, failed_check
from pipeline.checks.shard_columns import (
    check_structure,
    list_column_arrays,
    segment_max,
    segment_sum,
)
from pipeline.checks.split_totals import manifest_totals, sum_matches_manifest, totals_frame
from pipeline.core.errors import BertraceError

_PREVIEW = 24  # ids shown around a bad spot of a block


class _PackedSpec:
    """What a causal manifest promises about every block."""

    columns = ["input_ids"]
    static = False

    def __init__(self, m: dict, path: Path):
        try:
            special = {str(k): int(v) for k, v in m["special_ids"].items()}
            self.vocab_size = int(m["vocab_size"])
            self.max_seq_len = int(m["max_seq_len"])
            self.sep_id = int(m.get("separator_id", special["[SEP]"]))
            self.pad_id = special["[PAD]"]
            for info in m["splits"].values():
                for s in info["shards"]:
                    s["path"], s["rows"], s["sha256"]  # noqa: B018 - presence check
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            detail = f"missing key {e}" if isinstance(e, KeyError) else str(e)
            raise BertraceError(
                f"{path}: not a valid causal examples manifest ({detail}); rerun the examples stage"
            ) from None


def _row_expectations(E, spec: _PackedSpec) -> list:
    V, L, S = spec.vocab_size, spec.max_seq_len, spec.sep_id
    return [
        E.ExpectTableRowCountToEqual(value={"$PARAMETER": "rows"}, description="row count matches manifest.json"),
        E.ExpectColumnValuesToBeInSet(
            column="length", value_set=[L], description=f"every block is exactly max_seq_len {L} tokens"
        ),
        E.ExpectColumnValuesToBeInSet(column="null_values", value_set=[0], description="no null blocks or ids"),
        E.ExpectColumnValuesToBeBetween(
            column="max_token_id", min_value=0, max_value=V - 1, description=f"all input ids < vocab_size {V}"
        ),
        E.ExpectColumnValuesToBeInSet(
            column="pad_count", value_set=[0], description=f"no [PAD] (id {spec.pad_id}): blocks are never padded"
        ),
        E.ExpectColumnValuesToBeInSet(
            column="adjacent_separators",
            value_set=[0],
            description=f"no [SEP] (id {S}) right after another [SEP] or at the start of the shard (an empty document)",
        ),
    ]


def _split_expectations(E) -> list:
    return [
        *manifest_totals(E),
        sum_matches_manifest(E, "separators", "split [SEP] count (one per packed document) matches manifest.json"),
    ]


def _derive(table, spec: _PackedSpec):
    """Per-block facts of one shard (row index = block in the shard), and the ids for samples."""
    import pandas as pd

    off, ids, nulls = list_column_arrays(table.column("input_ids"))
    is_sep = ids == spec.sep_id
    after_sep = np.zeros(len(ids), dtype=bool)  # [SEP] preceded by [SEP]; the shard starts after a virtual one
    if len(ids):
        after_sep[0] = is_sep[0]
        after_sep[1:] = is_sep[1:] & is_sep[:-1]
    digests = [hashlib.blake2b(ids[a:b].tobytes(), digest_size=16).hexdigest() for a, b in zip(off[:-1], off[1:])]
    frame = pd.DataFrame(
        {
            "length": np.diff(off),
            "null_values": nulls,
            "max_token_id": segment_max(ids.astype(np.int64), off),
            "pad_count": segment_sum(ids == spec.pad_id, off),
            "sep_count": segment_sum(is_sep, off),
            "adjacent_separators": segment_sum(after_sep, off),
        }
    )
    return frame, digests, (off, ids)


def _check_shard(path: Path, entry: dict, spec: _PackedSpec, columns_suite, row_suite, max_sample_rows: int):
    """All checks of one shard; also ``(rows, tokens, separators, block digests)`` for the split and overlap checks."""
    target = str(path)
    results, table = check_structure(
        path,
        entry,
        spec,
        columns_suite,
        lambda table, _: (
            f"{path}: columns {table.column_names} are not exactly {spec.columns}; rerun the examples stage"
        ),
    )
    if table is None:
        return results, None
    frame, digests, (off, ids) = _derive(table, spec)

    def sample(i: int, value: Any) -> dict:
        seq = ids[off[i] : off[i + 1]].tolist()
        return {"row": i, "value": value, "input_ids": seq if len(seq) <= _PREVIEW else seq[:_PREVIEW] + ["..."]}

    for r in row_suite.run(frame, params={"rows": int(entry["rows"])}, samples=max_sample_rows, run_name=target):
        results.append(to_check(r, target, sample))
    return results, (len(frame), int(frame["length"].sum()), int(frame["sep_count"].sum()), digests)


def _overlap(gx: GX, parts: list[tuple[str, list[str]]], max_sample_rows: int) -> list[CheckResult]:
    """One GX uniqueness check over the digests of every block of every shard."""
    import pandas as pd

    frame = pd.DataFrame(
        {
            "block_hash": [d for _, ds in parts for d in ds],
            "shard": np.repeat(np.arange(len(parts)), [len(ds) for _, ds in parts]),
            "row": np.concatenate([np.arange(len(ds)) for _, ds in parts]) if parts else np.zeros(0, np.int64),
        }
    )
    suite = gx.definition(
        "packed blocks across shards",
        [
            gx.gxe.ExpectColumnValuesToBeUnique(
                column="block_hash",
                description="no block in two places: no shard overlaps another, train and valid share no block",
            ),
        ],
    )
    (r,) = suite.run(frame, complete=True, run_name="all shards")
    bad = frame.iloc[np.asarray(r.result.get("unexpected_index_list") or [], dtype=np.int64)]
    samples = [
        {"shard": parts[int(row.shard)][0], "row": int(row.row)} for row in bad.head(max_sample_rows).itertuples()
    ]
    n = len(bad)
    where = sorted({parts[int(s)][0] for s in bad.shard.unique()})
    msg = "no block occurs twice across all shards (train and valid)"
    if n:
        msg += f": {n} blocks occur more than once, in {', '.join(where[:5])}; rerun the examples stage"
    return [
        CheckResult(
            "all shards",
            "expect_column_values_to_be_unique(block_hash across shards)",
            n == 0,
            {"blocks": len(frame), "duplicated": n},
            n,
            samples,
            msg,
        )
    ]


def validate_packed_shards(
    examples_dir: Path, manifest: dict, *, max_sample_rows: int = 5, progress: bool = False
) -> ValidationReport:
    """Check every shard listed in a causal ``manifest`` (module docstring), and flag unlisted ones."""
    from tqdm import tqdm

    examples_dir = Path(examples_dir)
    manifest_path = examples_dir / "manifest.json"
    try:
        spec = _PackedSpec(manifest, manifest_path)
    except BertraceError as e:
        return ValidationReport([failed_check(manifest_path, "manifest_readable", str(e))])
    gx = GX()
    E = gx.gxe
    columns_suite = gx.definition(
        "packed shard columns",
        [
            E.ExpectTableColumnsToMatchSet(
                column_set=spec.columns,
                exact_match=True,
                description=f"columns are exactly {spec.columns} (packed causal-LM blocks)",
            ),
        ],
    )
    row_suite = gx.definition("packed shard blocks", _row_expectations(E, spec))
    split_suite = gx.definition("packed split totals", _split_expectations(E))

    results: list[CheckResult] = []
    listed: set[Path] = set()
    digests: list[tuple[str, list[str]]] = []
    entries = [(split, s) for split, info in manifest["splits"].items() for s in info["shards"]]
    per_split: dict[str, list] = {split: [] for split in manifest["splits"]}
    incomplete: dict[str, int] = {split: 0 for split in manifest["splits"]}
    for split, entry in tqdm(entries, desc="validate shards", unit="shard", disable=not progress):
        path = examples_dir / entry["path"]
        listed.add(path.resolve())
        checks, part = _check_shard(path, entry, spec, columns_suite, row_suite, max_sample_rows)
        results += checks
        if part is None:
            incomplete[split] += 1
        else:
            per_split[split].append(part[:3])
            digests.append((str(path), part[3]))

    for split, info in manifest["splits"].items():
        target = str(examples_dir / split)
        if incomplete[split]:
            results.append(
                CheckResult(
                    target,
                    "split_totals",
                    True,
                    None,
                    0,
                    [],
                    f"skipped: {incomplete[split]} shard(s) could not be checked",
                )
            )
            continue
        frame = totals_frame(per_split[split], ["rows", "tokens", "separators"])
        params = {k: int(info.get(k, 0)) for k in ("rows", "tokens", "separators")}
        results += [to_check(r, target) for r in split_suite.run(frame, params=params, run_name=target)]
    results += _overlap(gx, digests, max_sample_rows)
    for path in sorted(examples_dir.rglob("*.parquet")):
        if path.resolve() not in listed:
            results.append(
                failed_check(
                    path,
                    "shard_listed_in_manifest",
                    f"{path}: not listed in {manifest_path} (a stale shard from an earlier run?); "
                    "delete it or rerun the examples stage",
                )
            )
    return ValidationReport(results, gx.kept())
