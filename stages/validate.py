"""DVC stage `validate`: Great Expectations data checks on the clean corpus and the shards.

Writes ``reports/validate.json`` (every check), ``metrics/validate.json`` (pass / fail counts), the Data
Docs site and ``data/provenance/validate.json``.

In the pipeline: ``python -m stages.validate`` (params from params.yaml). On any directory
of shards, e.g. in CI: ``python -m stages.validate --shards path/to/examples`` (or
``bertrace validate path/to/examples``). Exit status 1 when an expectation fails; 2 (one
``error:`` line naming the params to change) when the tokenizer's normaliser alters more than
``validate.max_chars_altered`` of the corpus's letters (a params problem, not a data one).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.checks.gx import GX_MODULES, build_data_docs, import_gx
from pipeline.checks.report import ValidationReport
from pipeline.checks.validate import ValidateConfig, validate_normalizer
from pipeline.checks.validate_corpus import validate_corpus
from pipeline.checks.validate_shards import validate_shards
from pipeline.core.errors import BertraceError
from pipeline.core.io import write_json
from pipeline.data.engine import Beside, Engine, start_fork_server
from stages.common import METRICS_DIR, StageRun, load_params, run_stage

CLEAN = Path("data/clean")
EXAMPLES = Path("data/examples")
TOKENIZER = Path("data/tokenizer/tokenizer.json")
REPORT = Path("reports/validate.json")  # every check with observed values and sample rows
DATA_DOCS = Path("reports/data_docs")  # GX Data Docs site: open reports/data_docs/index.html


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stages.validate", description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=Path, help="validate this examples directory (with manifest.json) only")
    p.add_argument("--corpus", type=Path, nargs="+", help="validate these clean corpus files only")
    p.add_argument("--min-chars", type=int, default=None, help="corpus: minimum article length")
    p.add_argument("--nsp-tolerance", type=float, default=None)
    p.add_argument("--mask-rate-tolerance", type=float, default=None)
    p.add_argument("--workers", type=int, default=None, help="shard checks: processes (0 = all cores; default 0)")
    p.add_argument("--engine", choices=["local", "dask"], default=None, help="shard checks: where they run")
    p.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    p.add_argument(
        "--data-docs",
        type=Path,
        default=None,
        help=f"build the Great Expectations Data Docs site here (pipeline: {DATA_DOCS})",
    )
    return p


def _run_checks(run, engine, cfg, corpus_files, shards_dir, *, min_chars, nsp_tol, mask_tol, in_pipeline):
    """The corpus checks, the normaliser check (in the pipeline) and the shard checks, the first two
    beside the third (:class:`pipeline.data.engine.Beside`); their results in the report's order."""
    results, gx_results = [], []
    start_fork_server(engine, GX_MODULES)  # its import of GX runs beside this process's
    import_gx()  # before the processes beside start: their results hold GX objects
    corpus = None
    if corpus_files:  # the corpus checks run beside the shard checks (one more process)
        corpus = Beside(
            engine,
            "validate",
            validate_corpus,
            list(corpus_files),
            min_chars=min_chars,
            max_chars=cfg.corpus_max_chars,
            preload=GX_MODULES,
        )
    normalizer_check = None
    if in_pipeline:  # what the tokenizer's normaliser does to the corpus's letters (beside the rest)
        normalizer_check = Beside(
            engine,
            "validate",
            validate_normalizer,
            TOKENIZER,
            CLEAN / "train.txt",
            max_chars_altered=cfg.max_chars_altered,
        )
    for f in [*(corpus_files or []), *([TOKENIZER] if in_pipeline else [])]:  # hashed while those run
        if f.exists():
            run.add_input(f)
    shards_report = None
    if shards_dir:
        if (shards_dir / "manifest.json").exists():
            run.add_input(shards_dir / "manifest.json")
        shards_report = validate_shards(shards_dir, nsp_tolerance=nsp_tol, mask_rate_tolerance=mask_tol, engine=engine)
    for part in (corpus.result() if corpus else None, shards_report):  # the report's order: corpus, shards
        if part is not None:
            results += part.results
            gx_results += part.gx_results
    normalizer = normalizer_check.result() if normalizer_check else None
    if normalizer is not None:
        results.append(normalizer)
    return results, gx_results, normalizer


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    standalone = bool(args.shards or args.corpus)
    params = {} if standalone else load_params("validate")
    cfg = ValidateConfig.from_params(params)  # standalone: the defaults (= params.yaml's)
    overrides = {k: v for k, v in (("workers", args.workers), ("engine", args.engine)) if v is not None}
    engine = Engine.from_params({**cfg.model_dump(), **overrides}, "validate")  # speed only, never the report
    checks = {k: v for k, v in params.items() if k in cfg.recipe_keys()}  # what the record names
    min_chars = (
        args.min_chars if args.min_chars is not None else (0 if standalone else load_params("clean")["min_chars"])
    )  # checked by the clean stage, which ran first
    nsp_tol = args.nsp_tolerance if args.nsp_tolerance is not None else cfg.nsp_tolerance
    mask_tol = args.mask_rate_tolerance if args.mask_rate_tolerance is not None else cfg.mask_rate_tolerance
    corpus_files = args.corpus if standalone else [CLEAN / "train.txt", CLEAN / "valid.txt"]
    shards_dir = args.shards if standalone else EXAMPLES

    with StageRun("validate", {**checks, "min_chars": min_chars}, log_mlflow=not standalone) as run:
        results, gx_results, normalizer = _run_checks(
            run,
            engine,
            cfg,
            corpus_files,
            shards_dir,
            min_chars=min_chars,
            nsp_tol=nsp_tol,
            mask_tol=mask_tol,
            in_pipeline=not standalone,
        )
        report = ValidationReport(results, gx_results)
        docs_dir = args.data_docs or (None if standalone else DATA_DOCS)
        if docs_dir:  # a page per failed suite run (with GX's sample of unexpected values), one per suite
            index = build_data_docs(report.gx_results, docs_dir)
            run.log_artifact(docs_dir)  # MLflow artifacts data_docs/...
            print(f"validate: Great Expectations Data Docs -> {index}")
        report_path = args.report or (None if standalone else REPORT)
        full = report.to_dict()
        if report_path:
            write_json(report_path, full)
        if not standalone:  # DVC metrics: pass/fail counts (per expectation, every check: REPORT)
            write_json(
                METRICS_DIR / "validate.json", {"passed": full["checks"] - full["failures"], "failed": full["failures"]}
            )
        run.log_metrics({"checks": len(report.results), "failures": len(report.failures)})
        run.set_tags({"bertrace.validation": "passed" if report.success else "failed"})
        if report_path:
            run.log_artifact(report_path)
        if not standalone:  # data/provenance/validate.json: what was checked, so later runs link this one
            run.add_fields(
                {"validation": {"passed": report.success, "checks": full["checks"], "failed": full["failures"]}}
            )
            for path in (REPORT, METRICS_DIR / "validate.json"):
                run.add_output(path)
            run.write_provenance()
        print(report.format_text())
    if normalizer is not None and not normalizer.success:
        raise BertraceError(normalizer.message)
    if not report.success:
        sys.exit(1)


if __name__ == "__main__":
    run_stage(main)
