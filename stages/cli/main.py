"""The ``bertrace`` command: user-facing tools around the pipeline.

bertrace validate DIR                         Great Expectations checks on a shard directory
bertrace validate --corpus F [F ...]          ... or on clean corpus files
bertrace predict TEXT... | --file F [--model P]   classify texts (JSON lines out)
bertrace export --hf DIR [--checkpoint P] [--tokenizer T]   Hugging Face directory
bertrace generate PROMPT [--checkpoint P] [--max-new-tokens N] [--temperature T] [--top-k K]
                         [--top-p P] [--seed S]   sample text from a causal LM (streamed)
bertrace trace TARGET [--json] [--verify] [--root DIR]     lineage of a checkpoint, export or MLflow
                                              run/model back to the raw corpus; --verify rechecks it
bertrace attest TARGET --key PRIVATE.pem     sign an in-toto/SLSA statement of a checkpoint or export
bertrace verify-attestation TARGET --key PUBLIC.pem   check its signature, model files and materials
bertrace scorecard record NAME [--note T] [--set k=v]   keep the last run's scorecard row as a profile row
bertrace scorecard render                     rewrite reports/scorecard.md from the recorded rows
bertrace demo [--model P] [--port N]          the model on a web page (Gradio, 127.0.0.1) beside its
                                              trace summary; needs pip install -e '.[demo]'
bertrace plots [--out reports/plots.html]     the pipeline's plots in one offline HTML file
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="bertrace",
        description="bertrace tools",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("validate", help="validate a shard directory or corpus files", add_help=False)
    sub.add_parser("predict", help="classify texts with a fine-tuned model (JSON lines)", add_help=False)
    sub.add_parser("export", help="export a checkpoint as a Hugging Face directory", add_help=False)
    sub.add_parser("generate", help="sample text from a causal-LM checkpoint (pretrain.objective: clm)", add_help=False)
    sub.add_parser(
        "trace", help="lineage of a checkpoint, export or MLflow run/model (--verify rechecks it)", add_help=False
    )
    sub.add_parser("attest", help="sign an in-toto (SLSA provenance) statement of a model", add_help=False)
    sub.add_parser(
        "verify-attestation", help="check a model's signed statement: signature, files, materials", add_help=False
    )
    sub.add_parser(
        "scorecard", help="record the last run's scorecard row as a profile, or render the scorecard", add_help=False
    )
    sub.add_parser(
        "demo", help="serve the model on a web page (Gradio, 127.0.0.1) with its trace summary", add_help=False
    )
    sub.add_parser("plots", help="write the pipeline's plots as one self-contained HTML file (offline)", add_help=False)
    sub.add_parser(
        "check-tracking", help="check that the MLflow tracking store answers (make repro runs it first)", add_help=False
    )
    args = parser.parse_args(argv[:1])
    rest = argv[1:]
    from stages.common import run_stage

    if args.command == "validate":
        from stages import validate

        if rest and not rest[0].startswith("-"):
            rest = ["--shards", *rest]
        run_stage(lambda: validate.main(rest))
    elif args.command in ("predict", "export"):
        from stages.cli import predict

        run_stage(lambda: (predict.main_predict if args.command == "predict" else predict.main_export)(rest))
    elif args.command == "generate":
        from stages.cli import generate

        run_stage(lambda: generate.main(rest))
    elif args.command == "trace":
        from stages.cli import trace

        run_stage(lambda: trace.main(rest))
    elif args.command in ("attest", "verify-attestation"):
        from stages.cli import attest

        run_stage(lambda: sys.exit((attest.main_attest if args.command == "attest" else attest.main_verify)(rest)))
    elif args.command == "scorecard":
        from stages import scorecard

        sys.exit(scorecard.main(rest))
    elif args.command == "demo":
        from stages.cli import demo

        run_stage(lambda: demo.main(rest))
    elif args.command == "check-tracking":
        run_stage(_check_tracking)
    elif args.command == "plots":
        from stages import plots

        sys.exit(plots.cli(rest))


def _check_tracking() -> None:
    """One request to the tracking store of MLFLOW_TRACKING_URI (or ./mlflow.db): a server that is
    down or refuses the credentials fails here, before `dvc repro` removes any stage's outputs."""
    import os

    from pipeline.lineage.mlflow_store import redacted_uri, setup_mlflow, tracking_uri

    if os.environ.get("BERTRACE_NO_MLFLOW") == "1":
        print("MLflow tracking is off (BERTRACE_NO_MLFLOW=1)")
        return
    setup_mlflow()
    print(f"MLflow tracking store answers: {redacted_uri(tracking_uri())}")


if __name__ == "__main__":
    main()
