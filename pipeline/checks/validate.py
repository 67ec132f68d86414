"""Data checks of the `validate` stage, evaluated by Great Expectations (GX Core 1.x).

Two reports:

* ``validate_corpus``: the clean corpus (one document per line) — row count, no blank
  lines, no line separators inside a document, length bounds, no duplicate documents
  within a file or across files (train and valid share no document).
* ``validate_shards``: the examples shards against their ``manifest.json`` — sha256 and row
  counts, then per-row invariants of Google's ``create_pretraining_data.py`` format
  (``[CLS] A [SEP] B [SEP]``, segment ids, NSP labels, masked-LM positions), and per split the
  NSP balance and the masked share of tokens.

Per-row facts (first token, number of [SEP], ...) are computed vectorised from the Arrow list
offsets/values of one shard at a time, so memory stays bounded by the largest shard; GX then
evaluates the expectations on that small per-row frame and supplies the unexpected rows.
Bad input (missing manifest, unreadable Parquet, missing columns) becomes a failed
``CheckResult`` that names the file, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

import numpy as np
from pydantic import Field

from pipeline.checks.gx import GX, SuiteRun, to_check
from pipeline.checks.report import LINE_SEPARATORS, CheckResult, ValidationReport, failed_check, preview
from pipeline.checks.shard_columns import (
    check_structure,
    list_column_arrays,
    nullable_ints,
    segment_max,
    segment_sum,
)
from pipeline.checks.validate_packed import validate_packed_shards
from pipeline.core.config import Float, Int, Section
from pipeline.core.errors import BertraceError
from pipeline.core.io import read_json

NSP_MIN_ROWS = 200  # below this the NSP mean is too noisy to judge (sd of the mean ≈ 0.035)
CORPUS_SAMPLE_ROWS = 5
CORPUS_CHUNK_BYTES = 16 << 20  # corpus text per GX batch: bounds memory (GX copies the column to Arrow)
_PREVIEW_TOKENS = 40
# Everything Python's str.splitlines breaks on, besides "\n" itself (which splits the file).
_SEPARATOR_REGEX = "[" + LINE_SEPARATORS + "]"
_BLANK_REGEX = "^[" + "".join(c for c in map(chr, range(0x3001)) if c.isspace()) + "\u200b\ufeff]*$"


class ValidateConfig(Section):
    """The ``validate`` section of params.yaml (defaults equal params.yaml; tests/unit/core/test_config.py)."""

    SECTION: ClassVar[str] = "validate"

    nsp_tolerance: Annotated[Float, Field(ge=0, le=0.5)] = 0.1  # NSP label mean in 0.5 ± this
    mask_rate_tolerance: Annotated[Float, Field(ge=0, le=1)] = 0.03  # static masking: masked share ± this
    corpus_max_chars: Annotated[Int, Field(ge=1)] | None = None  # optional upper bound on article length
    max_chars_altered: Annotated[Float, Field(ge=0, le=1)] = (
        0.05  # share of letters the tokenizer's normaliser may alter
    )


# ---------------------------------------------------------------------------------------------
# The tokenizer's normaliser on the corpus

NORMALIZER_CHECK = "normalizer_keeps_letters"


def validate_normalizer(tokenizer_json: Path, corpus: Path, *, max_chars_altered: float) -> CheckResult:
    """The share of the corpus's letters (and marks, digits) that the tokenizer's normaliser
    removes or changes, case folding aside, must stay at most ``max_chars_altered``: uncased
    BERT's accent stripping deletes letters in scripts whose combining marks are letters
    (Bengali ``অক্সিজেন`` → ``অকসিজেন``) while UNK rate and tokens per word look excellent."""
    from pipeline.data.tokenizer import describe_alterations, normalizer_report, normalizer_settings, words_altered

    tokenizer_json, corpus = Path(tokenizer_json), Path(corpus)
    for path in (tokenizer_json, corpus):
        if not path.is_file():
            return failed_check(tokenizer_json, NORMALIZER_CHECK, f"{path}: not found; run the tokenizer stage first")
    try:
        report = normalizer_report(tokenizer_json, corpus)
        setting = normalizer_settings(tokenizer_json)
    except BertraceError as e:
        return failed_check(tokenizer_json, NORMALIZER_CHECK, str(e))
    observed = {k: report[k] for k in ("chars_altered", "chars_removed", "chars_changed", "letters")}
    observed.update(setting)
    ok = report["chars_altered"] <= max_chars_altered
    if ok:
        return CheckResult(
            str(tokenizer_json),
            NORMALIZER_CHECK,
            True,
            observed,
            0,
            report["top"],
            f"the normaliser alters at most validate.max_chars_altered {max_chars_altered} of the letters of {corpus}",
        )
    report.update(words_altered(tokenizer_json, corpus, report["altered_chars"]))
    fix = (
        "set tokenizer.strip_accents: auto (strips only Latin, Greek and Cyrillic accents) or false, or "
        "tokenizer.lowercase: false (cased)"
        if setting["strip_accents"] is True
        else "set tokenizer.strip_accents: false (keeps every accent) or tokenizer.lowercase: false (cased)"
    )
    message = (
        f"{tokenizer_json}: {describe_alterations(report, corpus)}, above validate.max_chars_altered "
        f"{max_chars_altered} (tokenizer.lowercase: {str(setting['lowercase']).lower()}, "
        f"strip_accents: {str(setting['strip_accents']).lower()}); {fix}, then dvc repro; or raise "
        "validate.max_chars_altered to accept it"
    )
    return CheckResult(str(tokenizer_json), NORMALIZER_CHECK, False, observed, 0, report["top"], message)


# ---------------------------------------------------------------------------------------------
# Clean corpus


def validate_corpus(
    files: list[Path],
    *,
    min_chars: int,
    max_chars: int | None = None,
    min_rows: int = 1,
    max_rows: int | None = None,
) -> ValidationReport:
    """Check clean corpus files: one non-blank, unique document per line, length in bounds.

    Lines are split on "\\n" only, so any other separator that ``str.splitlines`` would break
    on (\\r, \\x0b, \\x0c, \\x1c-\\x1e, \\x85, \\u2028, \\u2029) shows up as a bad document
    instead of silently turning one article into several downstream. Files are streamed in
    chunks of ``CORPUS_CHUNK_BYTES``; only a 16-byte digest per document is kept for the
    row count and duplicate checks.
    """
    gx = GX()
    E = gx.gxe
    text_suite = gx.definition(
        "corpus text",
        [
            E.ExpectColumnValuesToNotMatchRegex(
                column="text", regex=_BLANK_REGEX, description="no empty (or whitespace-only) lines"
            ),
            E.ExpectColumnValuesToNotMatchRegex(
                column="text",
                regex=_SEPARATOR_REGEX,
                description="no \\r, \\v, \\f, \\x1c-\\x1e, \\x85, \\u2028/9 inside a document",
            ),
            E.ExpectColumnValueLengthsToBeBetween(
                column="text",
                min_value=min_chars,
                max_value=max_chars,
                description=f"document length (chars) in [{min_chars}, {max_chars or 'inf'}]",
            ),
        ],
    )
    doc_suite = gx.definition(
        "corpus documents",
        [
            E.ExpectTableRowCountToBeBetween(
                min_value=min_rows,
                max_value=max_rows,
                description=f"file has {min_rows}..{max_rows or 'any'} documents (lines)",
            ),
            E.ExpectColumnValuesToBeUnique(
                column="document_hash", description="no duplicate documents within the file (blake2b of the line)"
            ),
        ],
    )
    results: list[CheckResult] = []
    digests: list[tuple[str, Any]] = []  # per file: (path, frame of unique document hashes + first line)
    for path in map(Path, files):
        target = str(path)
        if not path.is_file():
            results.append(failed_check(target, "file_exists", f"{path}: not found; run the clean stage first"))
            continue
        checks, frame = _check_corpus_file(path, text_suite, doc_suite)
        results += checks
        if frame is not None:
            digests.append((target, frame))
    if len(digests) > 1:
        results += _cross_file_duplicates(gx, digests)
    return ValidationReport(results, gx.kept())


def _check_corpus_file(path: Path, text_suite: "SuiteRun", doc_suite: "SuiteRun"):
    import pandas as pd

    target = str(path)
    merged: list[CheckResult] = []
    hashes: list[bytes] = []
    first_line = 1
    for docs, bad in _read_chunks(path):
        if bad is not None:
            line, byte, reason = bad
            return [
                CheckResult(
                    target,
                    "utf8_decodable",
                    False,
                    f"byte {byte}: {reason}",
                    1,
                    [{"line": line, "byte": byte}],
                    f"{path}: not valid UTF-8 (line {line}); rerun the clean stage",
                )
            ], None
        # object dtype: pandas keeps Python strings until GX's regex metrics convert them.
        frame = pd.DataFrame({"text": pd.Series(docs, dtype=object)})

        def sample(i: int, _value: Any, docs=docs, first=first_line) -> dict:
            return {"line": first + i, "chars": len(docs[i]), "text": preview(docs[i])}

        chunk = [
            to_check(r, target, sample) for r in text_suite.run(frame, samples=CORPUS_SAMPLE_ROWS, run_name=target)
        ]
        merged = chunk if not merged else [_merge(a, b) for a, b in zip(merged, chunk)]
        hashes += [hashlib.blake2b(d.encode("utf-8"), digest_size=16).digest() for d in docs]
        first_line += len(docs)

    frame = pd.DataFrame({"document_hash": [h.hex() for h in hashes], "line": np.arange(1, len(hashes) + 1)})
    del hashes
    doc_checks = [to_check(r, target, lambda i, _v: {"line": i + 1}) for r in doc_suite.run(frame, run_name=target)]
    for c in doc_checks:
        if c.expectation.startswith("expect_table_row_count") and not c.success and len(frame) == 0:
            c.message = f"{path}: file is empty; " + c.message
        if c.expectation.startswith("expect_column_values_to_be_unique") and c.sample_rows:
            rows = [s["line"] - 1 for s in c.sample_rows]
            first = frame.groupby("document_hash")["line"].min()
            texts = _lines_at(path, {s["line"] for s in c.sample_rows})
            for s, i in zip(c.sample_rows, rows):
                s["first_seen_line"] = int(first[frame["document_hash"].iat[i]])
                s["text"] = preview(texts.get(s["line"], ""))
            c.observed["unexpected_values"] = []  # digests say nothing to a reader; see the sample rows
    unique = frame.drop_duplicates("document_hash")
    return doc_checks[:1] + (merged or []) + doc_checks[1:], unique


def _merge(a: CheckResult, b: CheckResult) -> CheckResult:
    """One file's result from the results of two consecutive chunks."""
    counts: dict[Any, int] = {}
    for part in (a.observed or {}).get("unexpected_values", []) + (b.observed or {}).get("unexpected_values", []):
        key = json.dumps(part["value"], default=str)
        counts[key] = counts.get(key, 0) + part["count"]
    values = [{"value": json.loads(k), "count": n} for k, n in list(counts.items())[:CORPUS_SAMPLE_ROWS]]
    rows = (a.observed or {}).get("rows", 0) + (b.observed or {}).get("rows", 0)
    return CheckResult(
        a.target,
        a.expectation,
        a.success and b.success,
        {"rows": rows, "unexpected_values": values},
        a.unexpected_count + b.unexpected_count,
        (a.sample_rows + b.sample_rows)[:CORPUS_SAMPLE_ROWS],
        a.message,
    )


def _read_chunks(path: Path):
    """Yield ``(lines, None)`` in chunks of about CORPUS_CHUNK_BYTES, split on "\\n" only (binary
    readline), then ``([], (line, byte, reason))`` and stop if a line is not UTF-8. An empty
    file yields one empty chunk."""
    docs: list[str] = []
    size = offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            body = raw[:-1] if raw.endswith(b"\n") else raw
            try:
                docs.append(body.decode("utf-8"))
            except UnicodeDecodeError as e:
                yield [], (lineno, offset + e.start, e.reason)
                return
            offset += len(raw)
            size += len(raw)
            if size >= CORPUS_CHUNK_BYTES:
                yield docs, None
                docs, size = [], 0
    if docs or offset == 0:
        yield docs, None


def _lines_at(path: Path, wanted: set[int]) -> dict[int, str]:
    out = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno in wanted:
                out[lineno] = raw.rstrip(b"\n").decode("utf-8", errors="replace")
                if len(out) == len(wanted):
                    break
    return out


def _cross_file_duplicates(gx: GX, digests: list) -> list[CheckResult]:
    """Documents that occur in more than one file (e.g. train and valid overlap)."""
    import pandas as pd

    frame = pd.concat([h.assign(file=k) for k, (_, h) in enumerate(digests)], ignore_index=True)
    suite = gx.definition(
        "corpus across files",
        [
            gx.gxe.ExpectColumnValuesToBeUnique(
                column="document_hash", description="no document in more than one file"
            ),
        ],
    )
    (r,) = suite.run(frame, complete=True, run_name="all corpus files")
    bad = frame.iloc[np.asarray(r.result.get("unexpected_index_list") or [], dtype=np.int64)]
    results = []
    for k, (target, _) in enumerate(digests):
        mine = bad[bad.file == k]
        others = bad[bad.file != k]
        where = {}
        for row in others.itertuples():
            where.setdefault(row.document_hash, f"{digests[row.file][0]}:{row.line}")
        samples = [
            {"line": int(row.line), "also_in": where.get(row.document_hash)}
            for row in mine.head(CORPUS_SAMPLE_ROWS).itertuples()
        ]
        files = sorted({digests[f][0] for f in others.file.unique()})
        msg = "no document in more than one file"
        if len(mine):
            msg += f": {len(mine)} documents also occur in {', '.join(files)}"
        results.append(
            CheckResult(
                target,
                "expect_column_values_to_be_unique(document_hash across files)",
                len(mine) == 0,
                {"shared_documents": len(mine)},
                len(mine),
                samples,
                msg,
            )
        )
    return results


# ---------------------------------------------------------------------------------------------
# Examples shards


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
