"""Data checks of the examples shards against their ``manifest.json``, evaluated by Great
Expectations: sha256 and row counts, then per-row invariants of Google's
``create_pretraining_data.py`` format (``[CLS] A [SEP] B [SEP]``, segment ids, NSP labels,
masked-LM positions), and per split, from a few sums per shard, the NSP balance and the masked
share of tokens (:mod:`pipeline.checks.split_totals`).

Per-row facts (first token, number of [SEP], ...) are computed vectorised from the Arrow list
offsets/values of one shard at a time. Shards are checked in batches (tasks of
:func:`pipeline.data.engine.run_tasks`: this process, local workers or a Dask cluster, merged in
manifest order): GX evaluates the row expectations once on the facts of a whole batch (GX's fixed
cost per run is ~0.2 s, its cost per row ~1.5 µs), and a shard with unexpected rows is checked
again on its own, so the report names the shard and its rows exactly as a per-shard run does.
Memory: one batch's facts per worker, and four numbers per shard for the split totals.
Bad input (missing manifest, unreadable Parquet, missing columns) becomes a failed
``CheckResult`` that names the file, never a traceback. Packed causal-LM shards have their own
suite (:mod:`pipeline.checks.validate_packed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.checks.gx import GX, GX_MODULES, SuiteRun, to_check
from pipeline.checks.report import CheckResult, ValidationReport, failed_check
from pipeline.checks.shard_columns import (
    check_structure,
    list_column_arrays,
    nullable_ints,
    segment_max,
    segment_sum,
)
from pipeline.checks.split_totals import check_split, shard_totals, split_expectations
from pipeline.checks.validate_packed import validate_packed_shards
from pipeline.core.errors import BertraceError
from pipeline.core.io import read_json
from pipeline.data.engine import Engine, run_tasks

_PREVIEW_TOKENS = 40
MAX_BATCH_ROWS = 200_000  # rows per GX run (~25 MB of per-row facts); GX costs ~0.2 s a run + ~1.5 µs a row
MIN_BATCH_ROWS = 50_000  # smaller batches (to feed more workers) would spend much of their time in GX's fixed cost
ROWS_PER_WORKER = 400_000  # ~5 CPU-s of checks: below this a local worker costs more than it saves
MAX_BATCH_SHARDS = 512


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
    engine: Engine | None = None,
    batch_rows: int | None = None,
) -> ValidationReport:
    """Check every shard listed in ``examples_dir/manifest.json`` (and flag unlisted ones).

    Shards are checked in batches of about ``batch_rows`` rows, one Great Expectations run per
    batch, by ``engine`` (default: this process); by default (``batch_rows`` None) both are sized
    from the manifest's rows (:func:`_sized`: a small directory is checked in this process). The
    report is the same for any batch size, number of workers and engine."""
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
    split_suite = gx.definition("split totals", split_expectations(gx.gxe, spec, nsp_tolerance))
    engine = engine or Engine("local", 1)
    entries = [
        (split, str(examples_dir / s["path"]), s) for split, info in manifest["splits"].items() for s in info["shards"]
    ]
    if batch_rows is None:
        engine, batch_rows = _sized(entries, engine)
    batches = _batches(entries, batch_rows, engine.local_workers)

    results: list[CheckResult] = []
    listed: set[Path] = set()
    parts: dict[str, list] = {split: [] for split in manifest["splits"]}
    incomplete: dict[str, list[str]] = {split: [] for split in manifest["splits"]}
    kept: dict[str, list] = {"columns": [], "rows": []}  # Data Docs: each suite's first run, then failed ones
    tasks = ((batch, i == 0) for i, batch in enumerate(batches))
    shared = (spec, max_sample_rows)
    try:
        with tqdm(total=len(entries), desc="validate shards", unit="shard", disable=not progress) as bar:
            for (batch, _), outcomes in run_tasks(
                _check_batch, shared, tasks, engine, what="validate", ordered=True, preload=GX_MODULES
            ):
                for (split, target, entry), (checks, part, runs) in zip(batch, outcomes):
                    listed.add(Path(target).resolve())
                    results += checks
                    if part is None:
                        incomplete[split].append(target)
                    else:
                        parts[split].append((target, *part))
                    for suite, res in runs.items():
                        if not kept[suite]:  # the first shard this suite ran on (a later batch's: rerun here)
                            kept[suite].append(res or _check_batch(shared, [(split, target, entry)], True)[0][2][suite])
                        elif res is not None and not res.success:
                            kept[suite].append(res)
                bar.update(len(batch))
    finally:
        _SUITES.clear()

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
        results += check_split(
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
    return ValidationReport(results, kept["columns"] + kept["rows"] + gx.kept())


def _sized(entries: list, engine: Engine) -> tuple[Engine, int]:
    """The engine and rows per batch for these shards: local workers only as many as have
    ROWS_PER_WORKER rows each (a worker first spends ~4 CPU-s importing Great Expectations);
    one process checks batches of MAX_BATCH_ROWS, workers about four batches each."""
    total = sum(_manifest_rows(e) for _, _, e in entries)
    if engine.kind == "local":
        engine = Engine("local", max(1, min(engine.local_workers, total // ROWS_PER_WORKER)))
        if engine.workers == 1:
            return engine, MAX_BATCH_ROWS
    return engine, min(MAX_BATCH_ROWS, max(MIN_BATCH_ROWS, -(-total // (4 * engine.local_workers))))


def _manifest_rows(entry: dict) -> int:
    try:
        return max(0, int(entry["rows"]))
    except (TypeError, ValueError):
        return 0


def _batches(entries: list, rows: int, workers: int = 1) -> list[list]:
    """Consecutive manifest entries cut into batches of about ``rows`` rows (at most MAX_BATCH_SHARDS
    shards). For several ``workers`` the last batches shrink, to the rows left per worker (not below
    MIN_BATCH_ROWS), so that the workers finish together instead of one waiting on the last."""
    left = sum(_manifest_rows(e[2]) for e in entries)
    batches, current, n = [], [], 0
    for e in entries:
        if not current:
            size = min(rows, max(MIN_BATCH_ROWS, left // workers))
        current.append(e)
        n += _manifest_rows(e[2])
        if n >= size or len(current) >= MAX_BATCH_SHARDS:
            batches.append(current)
            left -= n
            current, n = [], 0
    return batches + ([current] if current else [])


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


class _Suites:
    """One process's Great Expectations suites for a spec: the per-shard ones (whose results the
    report shows) and the batch ones that check the rows of many shards in one run."""

    def __init__(self, spec: _ShardSpec):
        gx = GX()
        E = gx.gxe
        self.columns = gx.definition(
            "shard columns",
            [
                E.ExpectTableColumnsToMatchSet(
                    column_set=spec.columns,
                    exact_match=True,
                    description=f"columns are exactly {spec.columns} ({'static' if spec.static else 'dynamic'} masking)",
                ),
            ],
        )
        self.rows = gx.definition("shard rows", _row_expectations(E, spec))
        # The per-row expectations of `rows` (all but its first two, the shard's row and token counts) ...
        self.batch_rows = gx.definition("shard rows, batch", _row_expectations(E, spec)[2:])
        # ... and those two counts as one row per shard.
        self.batch_totals = gx.definition(
            "shard totals, batch",
            [
                E.ExpectColumnPairValuesToBeEqual(column_A="rows", column_B="manifest_rows"),
                E.ExpectColumnPairValuesToBeEqual(column_A="tokens", column_B="manifest_tokens"),
            ],
        )


_SUITES: dict[_ShardSpec, _Suites] = {}  # this process's suites (one GX context per worker, not per batch)
# A batch run returns every unexpected row's index (to find the shards), none of the values.
_BATCH_FORMAT = {"result_format": "COMPLETE", "exclude_unexpected_values": True, "return_unexpected_index_query": False}


def _check_batch(shared: tuple, batch: list, first: bool) -> list[tuple[list[CheckResult], tuple | None, dict]]:
    """All checks of the shards of ``batch`` (``(split, path, manifest entry)``), the rows of all
    in one GX run. Per shard: its checks, its part of the split totals (:func:`_part`)
    (None when unreadable) and ``{suite: GX result}`` for the per-shard suites that ran on it, the
    result kept only when it failed or, ``first``, for the batch's first shard to reach the suite.

    A shard that fails in the batch run is checked again on its own with the per-shard suite, so
    its results (bad rows counted from 0 in the shard, samples, observed values) read exactly as
    when every shard is checked alone; a passing shard's results are those of a passing run."""
    spec, max_sample_rows = shared
    if spec not in _SUITES:
        _SUITES.clear()
        _SUITES[spec] = _Suites(spec)
    suites = _SUITES[spec]
    out: list[list] = []
    pending: list[tuple[int, Any]] = []  # (shard, per-row facts) for the batch run
    columns = _ColumnsOnce(suites.columns)
    for _split, target, entry in batch:
        path = Path(target)
        columns.ran, columns.result = False, None
        results, table = check_structure(path, entry, spec, columns, _columns_message(path))
        runs: dict[str, Any] = {}
        if columns.ran:
            res = columns.result
            keep = res is not None and (not res.success or (first and not any("columns" in o[2] for o in out)))
            runs["columns"] = res if keep else None
        out.append([results, None, runs])
        if table is None:
            continue
        try:
            frame, context = _derive(table, spec)
        except Exception as e:  # e.g. ids that do not fit the arithmetic; report, don't crash
            results.append(
                failed_check(
                    target, "derived_columns", f"{path}: cannot compute per-row facts ({type(e).__name__}: {e})"
                )
            )
            continue
        del table
        out[-1][1] = _part(frame, spec)
        if first and not any("rows" in o[2] for o in out[:-1]):
            checks, res = _row_checks(target, entry, frame, context, suites.rows, max_sample_rows)
            results += checks
            runs["rows"] = res
        else:
            runs["rows"] = None
            pending.append((len(out) - 1, frame))
    if pending:
        _run_batch(suites, batch, out, pending, spec, max_sample_rows)
    return [tuple(o) for o in out]


def _run_batch(suites: _Suites, batch: list, out: list, pending: list, spec: _ShardSpec, max_sample_rows: int) -> None:
    """The batch GX runs over the ``pending`` shards' facts; their row checks appended to ``out``."""
    import pandas as pd
    import pyarrow.parquet as pq

    rows = np.array([len(f) for _, f in pending], dtype=np.int64)
    tokens = np.array([int(f["length"].sum()) for _, f in pending], dtype=np.int64)
    totals = pd.DataFrame(
        {
            "rows": rows,
            "manifest_rows": [int(batch[i][2]["rows"]) for i, _ in pending],
            "tokens": tokens,
            "manifest_tokens": [int(batch[i][2].get("tokens", t)) for (i, _), t in zip(pending, tokens)],
        }
    )
    frame = pd.concat([f for _, f in pending], ignore_index=True)
    for name in frame.columns:  # GX compares nullable ints one by one in Python; floats (NaN = missing) vectorised
        if isinstance(frame[name].dtype, pd.Int64Dtype):
            frame[name] = frame[name].astype(np.float64)
    starts = np.concatenate([[0], np.cumsum(rows)])
    bad = np.zeros(len(pending), dtype=bool)
    for res, first_row in (
        (suites.batch_rows.validate(frame, result_format=_BATCH_FORMAT), starts),
        (suites.batch_totals.validate(totals, result_format=_BATCH_FORMAT), np.arange(len(pending) + 1)),
    ):
        for r in res.results:
            if r.success:
                continue
            index = np.asarray((r.result or {}).get("unexpected_index_list") or [], dtype=np.int64)
            # the shards of the unexpected rows; none listed (GX raised): every shard, each on its own
            bad[np.searchsorted(first_row, index, side="right") - 1 if len(index) else slice(None)] = True
    del frame
    configs = suites.rows.configurations
    for k, (i, facts) in enumerate(pending):
        _, target, entry = batch[i]
        if bad[k]:  # on its own: bad rows, samples and observed values as the per-shard suite gives them
            facts, context = _derive(pq.read_table(target), spec)
            checks, res = _row_checks(target, entry, facts, context, suites.rows, max_sample_rows)
            out[i][2]["rows"] = None if res.success else res
        else:
            checks = [to_check(_Passed(c, int(rows[k]), int(tokens[k])), target) for c in configs]
        out[i][0] += checks


class _ColumnsOnce:
    """The columns suite for :func:`check_structure`, run once per distinct list of column names in
    a batch: a passing result depends on the names alone, so the next shard with them reuses it
    (``result``: the GX result of this shard's own run, None when reused)."""

    def __init__(self, suite: SuiteRun):
        self.suite, self.passed = suite, {}
        self.ran, self.result = False, None

    def run(self, frame, *, run_name: str) -> list:
        self.ran, key = True, tuple(frame.columns)
        if key in self.passed:
            self.result = None
            return self.passed[key]
        self.result = self.suite.validate(frame, run_name=run_name)
        checks = self.suite.ordered(self.result)
        if self.result.success:
            self.passed[key] = checks
        return checks


class _Passed:
    """A passing GX expectation result of the per-shard row suite on a shard of ``rows`` rows."""

    success = True
    exception_info = None

    def __init__(self, config, rows: int, tokens: int):
        self.expectation_config = config
        if config.type == "expect_table_row_count_to_equal":
            self.result = {"observed_value": rows}
        elif config.type == "expect_column_sum_to_be_between":
            self.result = {"observed_value": tokens}
        else:
            self.result = {"element_count": rows, "unexpected_count": 0}


def _columns_message(path: Path):
    def message(table, check: CheckResult) -> str:
        diff = check.observed.get("mismatched", {}) if isinstance(check.observed, dict) else {}
        detail = ", ".join(f"{k} {v}" for k, v in diff.items() if v)
        return (
            f"{path}: columns {table.column_names} do not match the spec"
            + (f" ({detail})" if detail else "")
            + "; rerun the examples stage"
        )

    return message


def _part(frame, spec: _ShardSpec) -> tuple:
    """What the split totals keep of a shard (:func:`pipeline.checks.split_totals.shard_totals`)."""
    masked = frame["masked_count"].to_numpy() if spec.static else np.zeros(0, np.int64)
    return shard_totals(frame["next_sentence_label"].to_numpy(), frame["length"].to_numpy(), masked)


def _row_checks(
    target: str, entry: dict, frame, context: dict, row_suite: SuiteRun, max_sample_rows: int
) -> tuple[list[CheckResult], Any]:
    """The per-shard row suite on one shard's facts: its checks (bad rows with their ids) and the GX result."""

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
    res = row_suite.validate(frame, params=params, samples=max_sample_rows, run_name=target)
    checks = []
    for r in row_suite.ordered(res):
        column = r.expectation_config.kwargs.get("column") or r.expectation_config.kwargs.get("column_B", "value")
        checks.append(to_check(r, target, lambda i, v, c=column: sample(i, v, c)))
    return checks, res


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
