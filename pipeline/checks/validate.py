"""The ``validate`` stage's params and its check of the tokenizer's normaliser on the corpus.

The data checks, evaluated by Great Expectations (GX Core 1.x): the clean corpus
(:mod:`pipeline.checks.validate_corpus`), the examples shards against their manifest
(:mod:`pipeline.checks.validate_shards`; packed causal-LM shards :mod:`pipeline.checks.validate_packed`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import Field

from pipeline.checks.report import CheckResult, failed_check
from pipeline.core.config import Float, Int
from pipeline.core.errors import BertraceError
from pipeline.data.engine import EngineParams


class ValidateConfig(EngineParams):
    """The ``validate`` section of params.yaml (defaults equal params.yaml; tests/unit/core/test_config.py).
    The engine keys (``workers``, ``engine``, ``dask_scheduler``) set where the shard checks run, never
    the report; dvc.yaml does not track them."""

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
