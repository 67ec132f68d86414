"""Per split totals of the MLM / NSP examples shards (:mod:`pipeline.checks.validate_shards`), evaluated
by Great Expectations on a few numbers kept per row of every shard: rows and tokens against
``manifest.json``, the NSP label balance and the masked share of tokens."""

from __future__ import annotations

import numpy as np

from pipeline.checks.gx import SuiteRun, to_check
from pipeline.checks.report import CheckResult

NSP_MIN_ROWS = 200  # below this the NSP mean is too noisy to judge (sd of the mean ≈ 0.035)


def manifest_totals(E) -> list:
    """A split's row and token counts against manifest.json (suite parameters ``rows``, ``tokens``);
    the first expectations of both split suites, MLM/NSP and packed."""
    return [
        E.ExpectTableRowCountToEqual(value={"$PARAMETER": "rows"}, description="split row count matches manifest.json"),
        E.ExpectColumnSumToBeBetween(
            column="length",
            min_value={"$PARAMETER": "tokens"},
            max_value={"$PARAMETER": "tokens"},
            description="split token count matches manifest.json",
        ),
    ]


def split_expectations(E, spec, nsp_tolerance: float) -> list:
    """The split suite's expectations (``E``: ``great_expectations.expectations``; ``spec``: the
    manifest's promise, with ``static``)."""
    ex = [
        *manifest_totals(E),
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
    (``parts``: ``(shard, labels, lengths, masked counts)`` per shard; ``spec``: the manifest's
    promise, with ``static``, ``masked_lm_prob`` and ``max_seq_len``)."""
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
