"""DVC stage `clean`: one article per line, normalised and deduplicated → data/clean/{train,valid}.txt."""

from pathlib import Path

from pipeline.data.clean import CleanConfig, clean_corpus
from pipeline.data.engine import Engine
from stages.common import StageRun, load_params, run_stage

RAW = Path("data/raw")
OUT = Path("data/clean")


def main() -> None:
    params = load_params("clean")
    cfg = CleanConfig.from_params(params)
    with StageRun("clean", {k: v for k, v in params.items() if k in cfg.recipe_keys()}) as run:
        run.add_input(RAW)
        run.add_upstream("download")
        stats = clean_corpus(
            RAW,
            OUT,
            min_chars=cfg.min_chars,
            valid_fraction=cfg.valid_fraction,
            seed=cfg.seed,
            engine=Engine.from_params(cfg, "clean"),  # workers / engine / dask_scheduler: speed only
        )
        for name in ("train.txt", "valid.txt"):
            run.add_output(OUT / name)
        run.write_details(stats)  # reports/clean.json (data prep: no DVC metrics)
        run.write_provenance()
        print(f"clean: {stats}")


if __name__ == "__main__":
    run_stage(main)
