"""DVC stage `examples`: sharded Parquet MLM/NSP examples → data/examples/ (+ manifest.json)."""

from pathlib import Path

from pipeline.core.io import sha256_file
from pipeline.data.engine import Engine
from pipeline.data.examples import ExamplesConfig, generate_examples
from stages.common import StageRun, load_params, run_stage

CLEAN = Path("data/clean")
TOKENIZER = Path("data/tokenizer/tokenizer.json")
OUT = Path("data/examples")


def main() -> None:
    params = load_params("examples")
    cfg = ExamplesConfig.from_params(params)
    with StageRun("examples", {k: v for k, v in params.items() if k in cfg.recipe_keys()}) as run:
        run.add_upstream("clean")
        run.add_upstream("tokenizer")
        manifest = generate_examples(
            CLEAN / "train.txt", CLEAN / "valid.txt", TOKENIZER, OUT, cfg, engine=Engine.from_params(params, "examples")
        )
        for path in (CLEAN / "train.txt", CLEAN / "valid.txt", TOKENIZER):  # hashed while generating
            run.add_input(path, manifest["inputs"][path.name])
        manifest_sha = sha256_file(OUT / "manifest.json")
        run.add_output(OUT / "manifest.json", manifest_sha)
        run.set_tags(
            {
                "bertrace.examples_manifest_sha256": manifest_sha,
                "bertrace.tokenizer_sha256": manifest["tokenizer_sha256"],
            }
        )
        metrics = {}
        for split, info in manifest["splits"].items():
            metrics[split] = {k: v for k, v in info.items() if k != "shards"}
            metrics[split]["shards"] = len(info["shards"])
        run.write_details(metrics)  # reports/examples.json (data prep: no DVC metrics)
        run.log_timings(
            {
                "seconds": round(run.seconds, 2),
                "examples_per_s": round(metrics["train"]["rows"] / max(run.seconds, 1e-9), 1),
            }
        )
        run.log_artifact(OUT / "manifest.json")
        run.write_provenance()
        print(f"examples: train {metrics['train']['rows']} rows / valid {metrics['valid']['rows']} rows -> {OUT}")


if __name__ == "__main__":
    run_stage(main)
