"""DVC stage `download`: corpus from the Hugging Face hub (or a mirror) or local files → data/raw/."""

from pathlib import Path

from pipeline.data.download import DownloadConfig, download_corpus
from pipeline.data.hub import configured_mirror
from stages.common import StageRun, load_params, run_stage

OUT = Path("data/raw")


def main() -> None:
    params = load_params("download")
    mirror = configured_mirror(DownloadConfig.from_params(params).mirror)
    with StageRun("download", params) as run:
        manifest = download_corpus(params, OUT, mirror=mirror)
        for f in manifest.get("source", {}).get("files", []) or []:
            run.add_input(f["path"], f["sha256"])
        if mirror:
            run.add_fields({"mirror": str(mirror)})
        run.add_fields({"source": manifest.get("source")})  # hub id + resolved revision, or the local files
        run.add_output(OUT)
        run.set_tags({"bertrace.corpus_format": manifest.get("format")})
        run.write_details({"rows": manifest.get("total_rows")})  # no DVC metrics
        run.log_timings({"seconds": round(run.seconds, 2)})
        run.log_artifact(OUT / "manifest.json")
        run.write_provenance()
        print(f"download: {manifest.get('total_rows')} rows ({manifest.get('format')}) -> {OUT}")


if __name__ == "__main__":
    run_stage(main)
