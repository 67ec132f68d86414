"""Per split totals of the examples shards, evaluated by Great Expectations on one row per shard
(its rows, tokens and the like, summed by the shard checks), so their cost and memory do not grow
with the rows: rows and tokens against ``manifest.json`` (MLM/NSP and packed causal-LM shards), and
for MLM/NSP the NSP label balance and the masked share of tokens."""

from __future__ import annotations

import numpy as np

from pipeline.checks.gx import SuiteRun, to_check
from pipeline.checks.report import CheckResult

NSP_MIN_ROWS = 200  # below this the NSP mean is too noisy to judge (sd of the mean ≈ 0.035)
SHARD_TOTALS = ("rows", "tokens", "not_next", "masked")  # an MLM/NSP shard's part of its split's totals


def sum_matches_manifest(E, column: str, description: str):
    """The split's sum of the per-shard ``column`` equals manifest.json's (the suite parameter of
    the same name)."""
    return E.ExpectColumnSumToBeBetween(
        column=column,
        min_value={"$PARAMETER": column},
        max_value={"$PARAMETER": column},
        description=description,
    )


def manifest_totals(E) -> list:
    """A split's row and token counts (sums of the per-shard ``rows`` and ``tokens``) against
    manifest.json (suite parameters ``rows``, ``tokens``); the first expectations of both split
    suites, MLM/NSP and packed."""
    return [
        sum_matches_manifest(E, "rows", "split row count matches manifest.json"),
        sum_matches_manifest(E, "tokens", "split token count matches manifest.json"),
    ]


def totals_frame(parts: list, columns: list[str]):
    """The frame a split suite runs on: one row per shard, its numbers in ``columns``' order."""
    import pandas as pd

    return pd.DataFrame(list(parts) or np.zeros((0, len(columns)), np.int64), columns=columns).astype(np.int64)


def split_expectations(E, spec, nsp_tolerance: float) -> list:
    """The MLM/NSP split suite's expectations (``E``: ``great_expectations.expectations``; ``spec``:
    the manifest's promise, with ``static``)."""
    ex = [
        *manifest_totals(E),
        E.ExpectColumnSumToBeBetween(
            column="not_next",
            min_value={"$PARAMETER": "not_next_min"},
            max_value={"$PARAMETER": "not_next_max"},
            description=f"NSP labels balanced: NotNext share in 0.5 ± {nsp_tolerance} "
            "(Devlin et al. 2019, §3.1: 50% IsNext)",
        ),
    ]
    if spec.static:
        ex.append(
            E.ExpectColumnSumToBeBetween(
                column="masked",
                min_value={"$PARAMETER": "masked_min"},
                max_value={"$PARAMETER": "masked_max"},
                description="masked share of tokens in masked_lm_prob ± tolerance",
            )
        )
    return ex


def shard_totals(labels: np.ndarray, lengths: np.ndarray, masked: np.ndarray) -> tuple[int, int, int, int]:
    """One MLM/NSP shard's part of the split totals (:data:`SHARD_TOTALS`) from its per-row NSP
    labels, lengths and masked counts."""
    return (
        len(labels),
        int(lengths.sum(dtype=np.int64)),
        int(np.count_nonzero(labels == 1)),
        int(masked.sum(dtype=np.int64)),
    )


def check_split(
    target: str,
    info: dict,
    parts: list,
    spec,
    split_suite: SuiteRun,
    nsp_tolerance: float,
    mask_rate_tolerance: float,
    max_sample_rows: int,
) -> list[CheckResult]:
    """Split totals: rows and tokens vs the manifest, NSP balance, masked share of tokens
    (``parts``: ``(shard, rows, tokens, not_next, masked)`` per shard, :func:`shard_totals`;
    ``spec``: the manifest's promise, with ``static``, ``masked_lm_prob`` and ``max_seq_len``)."""
    frame = totals_frame([p[1:] for p in parts], list(SHARD_TOTALS))
    rows, tokens, not_next, masked = (int(frame[c].sum()) for c in SHARD_TOTALS)
    nsp_low, nsp_high = 0.5 - nsp_tolerance, 0.5 + nsp_tolerance
    p, tol = spec.masked_lm_prob, mask_rate_tolerance
    params = {
        "rows": int(info.get("rows", rows)),
        "tokens": int(info.get("tokens", tokens)),
        "not_next_min": nsp_low * rows,
        "not_next_max": nsp_high * rows,
        "masked_min": (p - tol) * tokens,
        "masked_max": (p + tol) * tokens,
    }
    results = []
    for r in split_suite.run(frame, params=params, run_name=target):
        check = to_check(r, target)
        col = r.expectation_config.kwargs.get("column")
        if col == "not_next":
            mean = not_next / rows if rows else None
            check.observed = {
                "not_next": not_next,
                "rows": rows,
                "mean": round(mean, 5) if mean is not None else None,
                "expected": [round(nsp_low, 5), round(nsp_high, 5)],
            }
            per_shard = [
                {"shard": s, "rows": n, "nsp_label_mean": round(k / n, 4) if n else None} for s, n, _, k, _ in parts
            ]
            per_shard.sort(key=lambda d: -abs((d["nsp_label_mean"] if d["nsp_label_mean"] is not None else 0.5) - 0.5))
            check.sample_rows = per_shard[:max_sample_rows]
            if rows < NSP_MIN_ROWS:
                check.success = True
                check.message = f"skipped: only {rows} rows (< {NSP_MIN_ROWS}); NSP mean reported, not judged"
            elif not check.success and mean is not None and mean > 0.5:
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
        elif col == "masked":
            check.observed = {
                "masked": masked,
                "tokens": tokens,
                "rate": round(masked / max(tokens, 1), 5),
                "expected": [round(p - tol, 5), round(p + tol, 5)],
            }
            per_shard = [
                {"shard": s, "masked": m, "tokens": t, "rate": round(m / max(t, 1), 5)} for s, _, t, _, m in parts
            ]
            per_shard.sort(key=lambda d: -abs(d["rate"] - p))
            check.sample_rows = per_shard[:max_sample_rows]
            check.message = f"masked share of tokens in masked_lm_prob {p} ± {tol}"
        results.append(check)
    return results
