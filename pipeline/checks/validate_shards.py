"""Data checks of the examples shards against their ``manifest.json``, evaluated by Great
Expectations: sha256 and row counts, then per-row invariants of Google's
``create_pretraining_data.py`` format (``[CLS] A [SEP] B [SEP]``, segment ids, NSP labels,
masked-LM positions), and per split the NSP balance and the masked share of tokens.

Per-row facts (first token, number of [SEP], ...) are computed vectorised from the Arrow list
offsets/values of one shard at a time, so memory stays bounded by the largest shard; GX then
evaluates the expectations on that small per-row frame and supplies the unexpected rows.
Bad input (missing manifest, unreadable Parquet, missing columns) becomes a failed
``CheckResult`` that names the file, never a traceback. Packed causal-LM shards have their own
suite (:mod:`pipeline.checks.validate_packed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.checks.gx import GX, SuiteRun, to_check
from pipeline.checks.report import CheckResult, ValidationReport, failed_check
from pipeline.checks.shard_columns import (
    check_structure,
    list_column_arrays,
    nullable_ints,
    segment_max,
    segment_sum,
)
from pipeline.checks.validate_packed import validate_packed_shards
from pipeline.core.errors import BertraceError
from pipeline.core.io import read_json

NSP_MIN_ROWS = 200  # below this the NSP mean is too noisy to judge (sd of the mean ≈ 0.035)
_PREVIEW_TOKENS = 40


@dataclass(frozen=True)
class _ShardSpec:
    """What the manifest promises about every row."""

    static: bool
    vocab_size: int
    max_seq_len: int
    cls_id: int
    sep_id: int
    mask_id: int
    special_ids: tuple[int, ...]
    never_masked_ids: tuple[int, ...]  # no label may be one of these (manifest's mask_candidates)
    masked_lm_prob: float
    max_predictions_per_seq: int

    @classmethod
    def from_manifest(cls, m: dict, path: Path) -> "_ShardSpec":
        try:
            special = {str(k): int(v) for k, v in m["special_ids"].items()}
            masking = m["masking"]
            if masking not in ("static", "dynamic"):
                raise ValueError(f"masking is {masking!r}, expected 'static' or 'dynamic'")
            if not isinstance(m["splits"], dict):
                raise ValueError("splits is not an object")
            for info in m["splits"].values():
                for s in info["shards"]:
                    s["path"], s["rows"], s["sha256"]  # noqa: B018 - presence check
            return cls(
                static=masking == "static",
                vocab_size=int(m["vocab_size"]),
                max_seq_len=int(m["max_seq_len"]),
                cls_id=special["[CLS]"],
                sep_id=special["[SEP]"],
                mask_id=special["[MASK]"],
                special_ids=tuple(sorted(set(special.values()))),
                # Google's candidates skip only [CLS]/[SEP] (so [UNK] may be a label); older
                # manifests, without the key, skipped every special token.
                never_masked_ids=(
                    (special["[CLS]"], special["[SEP]"])
                    if m.get("mask_candidates", "skip_special") == "google"
                    else tuple(sorted(set(special.values())))
                ),
                masked_lm_prob=float(m["masked_lm_prob"]) if masking == "static" else 0.0,
                max_predictions_per_seq=int(m["max_predictions_per_seq"]) if masking == "static" else 0,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            detail = f"missing key {e}" if isinstance(e, KeyError) else str(e)
            raise BertraceError(f"{path}: not a valid examples manifest ({detail}); rerun the examples stage") from None

    @property
    def columns(self) -> list[str]:
        cols = ["input_ids", "token_type_ids", "next_sentence_label"]
        return cols + (["masked_lm_positions", "masked_lm_ids"] if self.static else [])


def validate_shards(
    examples_dir: Path,
    *,
    nsp_tolerance: float = 0.08,
    mask_rate_tolerance: float = 0.03,
    max_sample_rows: int = 5,
    progress: bool = False,
) -> ValidationReport:
    """Check every shard listed in ``examples_dir/manifest.json`` (and flag unlisted ones)."""
    from tqdm import tqdm

    examples_dir = Path(examples_dir)
    manifest_path = examples_dir / "manifest.json"
    try:
        manifest = read_json(manifest_path)
        if not isinstance(manifest, dict):
            raise BertraceError(f"{manifest_path}: not a JSON object; rerun the examples stage")
        if manifest.get("mode") == "causal":  # packed causal-LM blocks: their own suite
            return validate_packed_shards(examples_dir, manifest, max_sample_rows=max_sample_rows, progress=progress)
        spec = _ShardSpec.from_manifest(manifest, manifest_path)
    except BertraceError as e:
        return ValidationReport([failed_check(manifest_path, "manifest_readable", str(e))])

    gx = GX()
    E = gx.gxe
    columns_suite = gx.definition(
        "shard columns",
        [
            E.ExpectTableColumnsToMatchSet(
                column_set=spec.columns,
                exact_match=True,
                description=f"columns are exactly {spec.columns} ({'static' if spec.static else 'dynamic'} masking)",
            ),
        ],
    )
    row_suite = gx.definition("shard rows", _row_expectations(E, spec))
    split_suite = gx.definition("split totals", _split_expectations(E, spec, nsp_tolerance))

    results: list[CheckResult] = []
    listed: set[Path] = set()
    entries = [(split, s) for split, info in manifest["splits"].items() for s in info["shards"]]
    parts: dict[str, list] = {split: [] for split in manifest["splits"]}
    incomplete: dict[str, list[str]] = {split: [] for split in manifest["splits"]}
    for split, entry in tqdm(entries, desc="validate shards", unit="shard", disable=not progress):
        path = examples_dir / entry["path"]
        listed.add(path.resolve())
        checks, part = _check_shard(path, entry, spec, columns_suite, row_suite, max_sample_rows)
        results += checks
        if part is None:
            incomplete[split].append(str(path))
        else:
            parts[split].append((str(path), *part))

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
                    f"skipped: {len(incomplete[split])} shard(s) could not be checked "
                    f"({', '.join(incomplete[split][:3])})",
                )
            )
            continue
        results += _check_split(
            target, info, parts[split], spec, split_suite, nsp_tolerance, mask_rate_tolerance, max_sample_rows
        )

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


def _row_expectations(E, spec: _ShardSpec) -> list:
    """Per-row invariants; columns are the derived facts computed by ``_derive``."""
    V = spec.vocab_size
    ex = [
        E.ExpectTableRowCountToEqual(value={"$PARAMETER": "rows"}, description="row count matches manifest.json"),
        E.ExpectColumnSumToBeBetween(
            column="length",
            min_value={"$PARAMETER": "tokens"},
            max_value={"$PARAMETER": "tokens"},
            description="token count (sum of lengths) matches manifest.json",
        ),
        E.ExpectColumnValuesToBeInSet(column="null_values", value_set=[0], description="no null lists or ids"),
        E.ExpectColumnValuesToBeInSet(
            column="first_token_id", value_set=[spec.cls_id], description=f"first token is [CLS] (id {spec.cls_id})"
        ),
        E.ExpectColumnValuesToBeInSet(
            column="sep_count",
            value_set=[2],
            description=f"exactly two [SEP] (id {spec.sep_id}): [CLS] A [SEP] B [SEP]",
        ),
        E.ExpectColumnValuesToBeInSet(
            column="last_token_id", value_set=[spec.sep_id], description=f"last token is [SEP] (id {spec.sep_id})"
        ),
        E.ExpectColumnValuesToBeBetween(
            column="max_token_id", min_value=0, max_value=V - 1, description=f"all input ids < vocab_size {V}"
        ),
        E.ExpectColumnValuesToBeBetween(
            column="length",
            min_value=1,
            max_value=spec.max_seq_len,
            description=f"1 <= length <= max_seq_len {spec.max_seq_len}",
        ),
        E.ExpectColumnValuesToBeInSet(
            column="token_type_length_diff", value_set=[0], description="token_type_ids as long as input_ids"
        ),
        E.ExpectColumnValuesToBeInSet(
            column="token_type_errors",
            value_set=[0],
            description="token_type_ids are 0 up to the first [SEP] inclusive, 1 after",
        ),
        E.ExpectColumnValuesToBeInSet(
            column="next_sentence_label", value_set=[0, 1], description="next_sentence_label in {0 IsNext, 1 NotNext}"
        ),
    ]
    if spec.static:
        ex += [
            E.ExpectColumnValuesToBeInSet(
                column="masked_lm_length_diff",
                value_set=[0],
                description="masked_lm_ids as long as masked_lm_positions",
            ),
            E.ExpectColumnValuesToBeBetween(
                column="masked_count",
                min_value=0,
                max_value=spec.max_predictions_per_seq,
                description=f"masked positions <= max_predictions_per_seq {spec.max_predictions_per_seq}",
            ),
            E.ExpectColumnValuesToBeInSet(
                column="positions_not_increasing", value_set=[0], description="masked_lm_positions strictly increasing"
            ),
            E.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A="length",
                column_B="max_masked_position",
                or_equal=False,
                ignore_row_if="either_value_is_missing",
                description="masked positions inside the sequence",
            ),
            E.ExpectColumnValuesToBeInSet(
                column="masked_special",
                value_set=[0],
                description="no masked position on [CLS]/[SEP], no label the recipe never masks",
            ),
            E.ExpectColumnValuesToBeBetween(
                column="max_masked_lm_id", min_value=0, max_value=V - 1, description=f"masked_lm_ids < vocab_size {V}"
            ),
            E.ExpectColumnValuesToBeInSet(
                column="stray_mask_tokens",
                value_set=[0],
                description=f"[MASK] (id {spec.mask_id}) only at masked positions",
            ),
        ]
    else:
        ex.append(
            E.ExpectColumnValuesToBeInSet(
                column="mask_token_count",
                value_set=[0],
                description=f"dynamic masking: no [MASK] (id {spec.mask_id}) stored",
            )
        )
    return ex


def _split_expectations(E, spec: _ShardSpec, nsp_tolerance: float) -> list:
    ex = [
        E.ExpectTableRowCountToEqual(value={"$PARAMETER": "rows"}, description="split row count matches manifest.json"),
        E.ExpectColumnSumToBeBetween(
            column="length",
            min_value={"$PARAMETER": "tokens"},
            max_value={"$PARAMETER": "tokens"},
            description="split token count matches manifest.json",
        ),
        E.ExpectColumnMeanToBeBetween(
            column="next_sentence_label",
            min_value=0.5 - nsp_tolerance,
            max_value=0.5 + nsp_tolerance,
            description=f"NSP labels balanced: mean in 0.5 ± {nsp_tolerance} (Devlin et al. 2019, §3.1: 50% IsNext)",
        ),
    ]
    if spec.static:
        ex.append(
            E.ExpectColumnSumToBeBetween(
                column="masked_count",
                min_value={"$PARAMETER": "masked_min"},
                max_value={"$PARAMETER": "masked_max"},
                description="masked share of tokens in masked_lm_prob ± tolerance",
            )
        )
    return ex


def _check_shard(
    path: Path, entry: dict, spec: _ShardSpec, columns_suite: SuiteRun, row_suite: SuiteRun, max_sample_rows: int
) -> tuple[list[CheckResult], tuple | None]:
    """All checks of one shard; also its (labels, lengths, masked counts) for the split totals."""
    target = str(path)

    def columns_message(table, check: CheckResult) -> str:
        diff = check.observed.get("mismatched", {}) if isinstance(check.observed, dict) else {}
        detail = ", ".join(f"{k} {v}" for k, v in diff.items() if v)
        return (
            f"{path}: columns {table.column_names} do not match the spec"
            + (f" ({detail})" if detail else "")
            + "; rerun the examples stage"
        )

    results, table = check_structure(path, entry, spec, columns_suite, columns_message)
    if table is None:
        return results, None
    try:
        frame, context = _derive(table, spec)
    except Exception as e:  # e.g. ids that do not fit the arithmetic; report, don't crash
        results.append(
            failed_check(target, "derived_columns", f"{path}: cannot compute per-row facts ({type(e).__name__}: {e})")
        )
        return results, None
    del table

    def sample(i: int, value: Any, column: str) -> dict:
        row = {"row": i, column: list(value) if isinstance(value, tuple) else value}
        for name, lists in context.items():
            if name == "input_ids" or name in _CONTEXT.get(column, ()):
                off, vals = lists
                seq = vals[off[i] : off[i + 1]].tolist()
                row[name] = (
                    seq
                    if len(seq) <= _PREVIEW_TOKENS
                    else seq[: _PREVIEW_TOKENS // 2] + ["..."] + seq[-_PREVIEW_TOKENS // 2 :]
                )
        return row

    params = {"rows": int(entry["rows"]), "tokens": int(entry.get("tokens", frame["length"].sum()))}
    for r in row_suite.run(frame, params=params, samples=max_sample_rows, run_name=target):
        column = r.expectation_config.kwargs.get("column") or r.expectation_config.kwargs.get("column_B", "value")
        results.append(to_check(r, target, lambda i, v, c=column: sample(i, v, c)))
    # Kept for the split totals until all shards are read: a few bytes per row.
    lengths = frame["length"].to_numpy().astype(np.int32)
    masked = frame["masked_count"].to_numpy().astype(np.int16) if spec.static else np.zeros(len(frame), np.int16)
    return results, (frame["next_sentence_label"].to_numpy().astype(np.int8), lengths, masked)


# Which list columns to show next to input_ids in a bad row's sample.
_CONTEXT = {
    "token_type_length_diff": ("token_type_ids",),
    "token_type_errors": ("token_type_ids",),
    "null_values": ("token_type_ids", "masked_lm_positions", "masked_lm_ids"),
    "masked_lm_length_diff": ("masked_lm_positions", "masked_lm_ids"),
    "masked_count": ("masked_lm_positions",),
    "positions_not_increasing": ("masked_lm_positions",),
    "max_masked_position": ("masked_lm_positions",),
    "masked_special": ("masked_lm_positions", "masked_lm_ids"),
    "max_masked_lm_id": ("masked_lm_ids",),
    "stray_mask_tokens": ("masked_lm_positions",),
}


def _derive(table, spec: _ShardSpec):
    """Per-row facts of one shard as a pandas frame (row index = row in the shard)."""
    import pandas as pd

    ids_off, ids, ids_null = list_column_arrays(table.column("input_ids"))
    tt_off, tt, tt_null = list_column_arrays(table.column("token_type_ids"))
    nsp = table.column("next_sentence_label")
    n = len(ids_off) - 1
    length = np.diff(ids_off)
    starts = ids_off[:-1]
    nonempty = length > 0

    is_sep = ids == spec.sep_id
    first = np.full(n, -1, dtype=np.int64)
    last = np.full(n, -1, dtype=np.int64)
    first[nonempty] = ids[starts[nonempty]]
    last[nonempty] = ids[ids_off[1:][nonempty] - 1]

    # Segment B (type 1) runs from just after the row's first [SEP] to its end: a +1 step there and
    # a -1 step at the row's end, summed up (one int8 per token).
    sep_at = np.flatnonzero(is_sep)
    sep_rows, first_of_row = np.unique(np.searchsorted(ids_off, sep_at, side="right") - 1, return_index=True)
    steps = np.zeros(len(ids) + 1, dtype=np.int8)
    np.add.at(steps, sep_at[first_of_row] + 1, 1)
    np.add.at(steps, ids_off[1:][sep_rows], -1)
    expected = np.cumsum(steps[:-1], dtype=np.int8)
    del steps, sep_at
    tt_len = np.diff(tt_off)
    tt_errors = np.zeros(n, dtype=np.int64)  # missing where the lengths differ (reported apart)
    same = tt_len == length
    if same.all():
        tt_errors[:] = segment_sum(tt != expected, ids_off)
    elif same.any():
        keep_ids, keep_tt = np.repeat(same, length), np.repeat(same, tt_len)
        sub_off = np.concatenate([[0], np.cumsum(length[same])])
        tt_errors[same] = segment_sum(tt[keep_tt] != expected[keep_ids], sub_off)

    nsp_null = np.asarray(nsp.is_null(), dtype=np.int64)
    frame = {
        "length": length,
        "first_token_id": first,
        "last_token_id": last,
        "sep_count": segment_sum(is_sep, ids_off),
        "max_token_id": segment_max(ids, ids_off),
        "token_type_length_diff": tt_len - length,
        "token_type_errors": nullable_ints(tt_errors, ~same),
        "next_sentence_label": nsp.fill_null(-1).to_numpy().astype(np.int64),
    }
    nulls = ids_null + tt_null + nsp_null
    mask_tokens = segment_sum(ids == spec.mask_id, ids_off)
    context = {"input_ids": (ids_off, ids), "token_type_ids": (tt_off, tt)}
    if spec.static:
        pos_off, pos, pos_null = list_column_arrays(table.column("masked_lm_positions"))
        lab_off, lab, lab_null = list_column_arrays(table.column("masked_lm_ids"))
        nulls = nulls + pos_null + lab_null
        count = np.diff(pos_off)
        pos64 = pos.astype(np.int64)
        row_start = np.zeros(len(pos), dtype=bool)
        row_start[pos_off[:-1][count > 0]] = True
        not_incr = np.zeros(len(pos), dtype=bool)
        not_incr[1:] = np.diff(pos64) <= 0
        not_incr &= ~row_start
        # The token each position points at (clipped into the row; out-of-range ones are flagged apart).
        prow = np.repeat(np.arange(n), count)
        inside = pos64 < length[prow]
        at = ids[starts[prow] + np.clip(np.minimum(pos64, length[prow] - 1), 0, None)] if len(ids) else pos64
        on_special = inside & ((pos64 == 0) | (at == spec.cls_id) | (at == spec.sep_id))
        frame.update(
            {
                "masked_lm_length_diff": np.diff(lab_off) - count,
                "masked_count": count,
                "positions_not_increasing": segment_sum(not_incr, pos_off),
                "max_masked_position": segment_max(pos64, pos_off),
                "masked_special": segment_sum(on_special, pos_off)
                + segment_sum(np.isin(lab, spec.never_masked_ids), lab_off),
                "max_masked_lm_id": segment_max(lab, lab_off),
                "stray_mask_tokens": mask_tokens - segment_sum(inside & (at == spec.mask_id), pos_off),
            }
        )
        context.update({"masked_lm_positions": (pos_off, pos), "masked_lm_ids": (lab_off, lab)})
    else:
        frame["mask_token_count"] = mask_tokens
    frame["null_values"] = nulls
    return pd.DataFrame(frame), context


def _check_split(
    target: str,
    info: dict,
    parts: list,
    spec: _ShardSpec,
    split_suite: SuiteRun,
    nsp_tolerance: float,
    mask_rate_tolerance: float,
    max_sample_rows: int,
) -> list[CheckResult]:
    """Split totals: rows and tokens vs the manifest, NSP balance, masked share of tokens."""
    import pandas as pd

    labels = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
    lengths = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64)
    masked = np.concatenate([p[3] for p in parts]) if parts else np.zeros(0, np.int64)
    tokens = int(lengths.sum(dtype=np.int64))
    frame = pd.DataFrame({"next_sentence_label": labels, "length": lengths, "masked_count": masked})
    p, tol = spec.masked_lm_prob, mask_rate_tolerance
    params = {
        "rows": int(info.get("rows", len(frame))),
        "tokens": int(info.get("tokens", tokens)),
        "masked_min": (p - tol) * tokens,
        "masked_max": (p + tol) * tokens,
    }
    results = []
    for r in split_suite.run(frame, params=params, run_name=target):
        check = to_check(r, target)
        col = r.expectation_config.kwargs.get("column")
        if r.expectation_config.type == "expect_column_mean_to_be_between":
            per_shard = [
                {"shard": s, "rows": len(lab), "nsp_label_mean": round(float(lab.mean()), 4) if len(lab) else None}
                for s, lab, _, _ in parts
            ]
            per_shard.sort(key=lambda d: -abs((d["nsp_label_mean"] if d["nsp_label_mean"] is not None else 0.5) - 0.5))
            check.sample_rows = per_shard[:max_sample_rows]
            if len(frame) < NSP_MIN_ROWS:
                check.success = True
                check.message = f"skipped: only {len(frame)} rows (< {NSP_MIN_ROWS}); NSP mean reported, not judged"
            elif not check.success and isinstance(check.observed, (int, float)) and check.observed > 0.5:
                check.message += (
                    f". A mean above 0.5 + {nsp_tolerance} usually means short documents: a chunk of one segment "
                    "always gets a random B (label 1), so a corpus of one- or two-sentence documents (e.g. the "
                    "paragraphs of one-article-per-file sources read as documents: set download.local.format: "
                    "document_per_file) leans to 1. Lengthen the documents (clean.min_chars) or raise "
                    "validate.nsp_tolerance for a corpus of short articles"
                )
                if spec.max_seq_len < 128:
                    check.message += (
                        f"; or short pairs: examples.max_seq_len is {spec.max_seq_len}, so a chunk of "
                        f"{spec.max_seq_len - 3} WordPieces often holds one sentence: raise it (BERT: 128)"
                    )
        elif col == "masked_count":
            rate = float(masked.sum(dtype=np.int64)) / max(tokens, 1)
            check.observed = {
                "masked": int(masked.sum(dtype=np.int64)),
                "tokens": tokens,
                "rate": round(rate, 5),
                "expected": [round(p - tol, 5), round(p + tol, 5)],
            }
            per_shard = [
                {
                    "shard": s,
                    "masked": int(m.sum(dtype=np.int64)),
                    "tokens": int(le.sum(dtype=np.int64)),
                    "rate": round(float(m.sum(dtype=np.int64)) / max(int(le.sum(dtype=np.int64)), 1), 5),
                }
                for s, _, le, m in parts
            ]
            per_shard.sort(key=lambda d: -abs(d["rate"] - p))
            check.sample_rows = per_shard[:max_sample_rows]
            check.message = f"masked share of tokens in masked_lm_prob {p} ± {tol}"
        results.append(check)
    return results
