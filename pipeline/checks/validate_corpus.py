"""Data checks of the clean corpus (one document per line), evaluated by Great Expectations:
row count, no blank lines, no line separators inside a document, length bounds, no duplicate
documents within a file or across files (train and valid share no document). Bad input becomes a
failed ``CheckResult`` that names the file, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.checks.gx import GX, SuiteRun, to_check
from pipeline.checks.report import LINE_SEPARATORS, CheckResult, ValidationReport, failed_check, preview

CORPUS_SAMPLE_ROWS = 5
CORPUS_CHUNK_BYTES = 16 << 20  # corpus text per GX batch: bounds memory (GX copies the column to Arrow)
# Everything Python's str.splitlines breaks on, besides "\n" itself (which splits the file).
_SEPARATOR_REGEX = "[" + LINE_SEPARATORS + "]"
_BLANK_REGEX = "^[" + "".join(c for c in map(chr, range(0x3001)) if c.isspace()) + "\u200b\ufeff]*$"


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
