"""What every data check returns: :class:`CheckResult` per expectation and target, the
:class:`ValidationReport` that adds them up (``reports/validate.json``, the one-screen text), and
how a bad value is shown (short, escaped where a line separator hides in it). Shared by the corpus
and shard suites (:mod:`pipeline.checks.validate`, :mod:`pipeline.checks.validate_packed`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PREVIEW_CHARS = 80
LINE_SEPARATORS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
# Literal characters in the classes: pandas may run GX's regexes with Arrow's RE2 (whose \s is
# ASCII-only) or with Python's re, and both read these classes the same way.


@dataclass
class CheckResult:
    """One evaluated expectation on one target (a file, or a split directory for split totals)."""

    target: str
    expectation: str  # GX expectation type and its column(s), or a file-level check name
    success: bool
    observed: Any = None
    unexpected_count: int = 0
    sample_rows: list = field(default_factory=list)  # a few bad rows: {"row"/"line": i, ...}
    message: str = ""  # what the check means, why it failed, or why it was skipped

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "target": self.target,
                "expectation": self.expectation,
                "success": bool(self.success),
                "observed": self.observed,
                "unexpected_count": int(self.unexpected_count),
                "sample_rows": self.sample_rows,
                "message": self.message,
            }
        )


@dataclass
class ValidationReport:
    results: list[CheckResult]
    gx_results: list = field(default_factory=list, repr=False)  # GX suite results for the Data Docs site

    def __add__(self, other: "ValidationReport") -> "ValidationReport":
        return ValidationReport(self.results + other.results, self.gx_results + other.gx_results)

    @property
    def success(self) -> bool:
        return all(r.success for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.success]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (reports/validate.json): counts, failed targets, every check."""
        failures = self.failures
        by_expectation: dict[str, dict[str, int]] = {}
        for r in self.results:
            counts = by_expectation.setdefault(r.expectation, {"checks": 0, "failures": 0})
            counts["checks"] += 1
            counts["failures"] += int(not r.success)
        return {
            "success": self.success,
            "checks": len(self.results),
            "failures": len(failures),
            "failed_targets": sorted({r.target for r in failures}),
            "by_expectation": by_expectation,
            "results": [r.to_dict() for r in self.results],
        }

    def format_text(self) -> str:
        """Human-readable: every failure (file, expectation, observed, sample rows), notes, summary."""
        lines: list[str] = []
        for r in self.failures:
            lines.append(f"FAIL {r.target}")
            lines.append(f"  expectation: {r.expectation}")
            if r.message:
                lines.append(f"  {r.message}")
            if r.observed is not None:
                lines.append(f"  observed: {short(jsonable(r.observed))}")
            if r.unexpected_count:
                lines.append(f"  unexpected: {r.unexpected_count}")
            for row in r.sample_rows:
                lines.append(f"    {short(jsonable(row), 300)}")
        for r in self.results:
            if r.success and r.message.startswith("skipped"):
                lines.append(f"NOTE {r.target}: {r.expectation}: {r.message} (observed {short(jsonable(r.observed))})")
        n_fail = len(self.failures)
        files = len({r.target for r in self.results})
        if n_fail:
            lines.append(
                f"validation FAILED: {n_fail} of {len(self.results)} checks failed on "
                f"{len({r.target for r in self.failures})} of {files} targets"
            )
        else:
            lines.append(f"validation passed: {len(self.results)} checks on {files} targets")
        return "\n".join(lines)


def jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def short(obj: Any, limit: int = 200) -> str:
    s = json.dumps(obj, ensure_ascii=True, default=str)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def failed_check(target: Path | str, check: str, message: str, observed: Any = None) -> CheckResult:
    """A failed file-level check (no GX expectation behind it): the target, the check's name and why."""
    return CheckResult(str(target), check, False, observed, 0, [], message)


def preview(s: str) -> str:
    """A short view of a document: its start, or the text around its first line separator
    (escaped, so that the separator is visible)."""
    k = next((i for i, c in enumerate(s) if c in LINE_SEPARATORS), -1) if has_separator(s) else -1
    if k < 0:
        return s[:PREVIEW_CHARS] + ("..." if len(s) > PREVIEW_CHARS else "")
    lo = max(0, k - PREVIEW_CHARS // 2)
    hi = lo + PREVIEW_CHARS
    mid = s[lo:hi].encode("unicode_escape").decode("ascii")
    return ("..." if lo else "") + mid + ("..." if hi < len(s) else "")


def has_separator(s: str) -> bool:
    return any(c in s for c in LINE_SEPARATORS)
