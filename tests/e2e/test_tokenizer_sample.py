"""The tokenizer stage on a seeded sample: same bytes for any thread count, the whole file when
it fits, the sample described in the record, one-line error when the sample holds nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from pipeline.data.tokenizer_training import train_wordpiece
from tests.conftest import REPO, shared_file


def _work(tmp_path: Path, **tokenizer) -> Path:
    work = tmp_path / "w"
    (work / "data/clean").mkdir(parents=True)
    docs = [line.strip() for line in shared_file("wikitext-2-raw/wiki.test.raw").read_text().splitlines()]
    docs = [d for d in docs if len(d) > 200]
    (work / "data/clean/train.txt").write_text("".join(d + "\n" for d in docs[:-200]), encoding="utf-8")
    (work / "data/clean/valid.txt").write_text("".join(d + "\n" for d in docs[-200:]), encoding="utf-8")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["tokenizer"].update(vocab_size=2000, **tokenizer)
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    return work


def _run(work: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), BERTRACE_NO_MLFLOW="1", TQDM_DISABLE="1")
    return subprocess.run(
        [sys.executable, "-m", "stages.tokenizer"], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )


def _outputs(work: Path) -> dict[str, bytes]:
    return {p: (work / p).read_bytes() for p in ("data/tokenizer/tokenizer.json", "data/tokenizer/vocab.txt")}


def test_sample_is_the_same_for_any_thread_count_and_recorded(tmp_path):
    outs = {}
    for workers in (1, 2):
        work = _work(tmp_path / str(workers), sample_bytes=300_000, workers=workers)
        proc = _run(work)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs[workers] = {**_outputs(work), "record": (work / "data/provenance/tokenizer.json").read_bytes()}
    assert outs[1] == outs[2]  # the record too: workers is not a recipe key
    record = json.loads(outs[1]["record"])
    assert "workers" not in record["params"] and record["params"]["sample_bytes"] == 300_000
    train = record["sample"]["train"]
    size = (work / "data/clean/train.txt").stat().st_size
    assert train["sampled"] and 290_000 < train["bytes"] <= 300_000 and train["of_bytes"] == size
    assert record["sample"]["valid"]["bytes"] <= 30_000 and record["sample"]["valid"]["sampled"]
    assert all("/" not in str(v) for s in record["sample"].values() for v in s.values())  # no temp paths


def test_a_corpus_that_fits_trains_on_all_of_it(tmp_path):
    work = _work(tmp_path, sample_bytes=10**9)
    proc = _run(work)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((work / "data/provenance/tokenizer.json").read_text())
    assert not record["sample"]["train"]["sampled"]
    train_wordpiece(
        work / "data/clean/train.txt", tmp_path / "direct", vocab_size=2000, lowercase=True, min_frequency=2
    )
    assert (tmp_path / "direct/tokenizer.json").read_bytes() == (work / "data/tokenizer/tokenizer.json").read_bytes()


def test_a_sample_smaller_than_every_document_is_one_line(tmp_path):
    work = _work(tmp_path, sample_bytes=50)
    proc = _run(work)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "error: params.yaml: tokenizer.sample_bytes=50 is smaller than every document of data/clean/train.txt" in (
        proc.stderr
    )
