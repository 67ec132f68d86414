"""Scale-out of the examples stage: a real Dask cluster (2 worker processes) writes the same
bytes as the local engine, and the engine is chosen by params or the environment."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import BertraceError
from pipeline.core.formats import SPECIAL_IDS
from pipeline.core.io import sha256_file
from pipeline.data.engine import Engine
from pipeline.data.examples import ExamplesConfig, _partition_task, code_fingerprint, generate_examples

distributed = pytest.importorskip("distributed", reason="pip install 'bertrace[dask]'")

CFG = ExamplesConfig(max_seq_len=64, dupe_factor=3, valid_dupe_factor=2, docs_per_shard=8, seed=11)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 train / 6 valid documents of random words (plus some non-ASCII text and an added token)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(5)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(400)]
    words += ["Café", "naïve", "über", "東京", "[MASK]", "x" * 120, "don't", "U.S.", "3.5"]

    def doc():
        return " ".join(
            " ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) + rng.choice(".!?")
            for _ in range(rng.randint(5, 30))
        )

    (root / "train.txt").write_text("".join(doc() + "\n" for _ in range(40)), encoding="utf-8")
    (root / "valid.txt").write_text("".join(doc() + "\n" for _ in range(6)), encoding="utf-8")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train(
        [str(root / "train.txt")],
        trainers.WordPieceTrainer(vocab_size=600, special_tokens=list(SPECIAL_IDS), show_progress=False),
    )
    tok.save(str(root / "tokenizer.json"))
    return root


def _shard_hashes(out: Path, manifest: dict) -> dict[str, str]:
    return {s["path"]: sha256_file(out / s["path"]) for split in manifest["splits"].values() for s in split["shards"]}


def _generate(corpus: Path, out: Path, **engine) -> dict:
    return generate_examples(
        corpus / "train.txt", corpus / "valid.txt", corpus / "tokenizer.json", out, CFG, progress=False, **engine
    )


@pytest.fixture(scope="module")
def local_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    return out, _generate(corpus, out, workers=1)


def test_dask_cluster_writes_the_same_bytes_as_the_local_engine(corpus, local_run, tmp_path):
    from distributed import Client, LocalCluster

    import pipeline.data.examples as examples

    out1, man1 = local_run
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        man = _generate(corpus, tmp_path, engine="dask", scheduler=cluster.scheduler_address)
        # the partitions were processed in the worker processes (each keeps its worker state), not here
        built = client.run(lambda: len(__import__("pipeline.data.examples").data.examples._WORKERS))
    assert len(built) == 2 and sum(built.values()) >= 1
    assert examples._WORKERS == {}
    assert man == man1  # shard sha256s, rows, tokens, NSP and mask fractions
    assert (tmp_path / "manifest.json").read_bytes() == (out1 / "manifest.json").read_bytes()
    assert _shard_hashes(tmp_path, man) == _shard_hashes(out1, man1)
    assert len(man["splits"]["train"]["shards"]) == 5 * 3  # 40 docs / 8 per shard x 3 dupes


def test_local_worker_counts_write_the_same_bytes(corpus, local_run, tmp_path):
    out1, man1 = local_run
    man2 = _generate(corpus, tmp_path, workers=2)
    assert man2 == man1
    assert _shard_hashes(tmp_path, man2) == _shard_hashes(out1, man1)


def test_dask_without_an_address_starts_a_local_cluster(corpus, local_run, tmp_path, monkeypatch):
    monkeypatch.delenv("BERTRACE_DASK_SCHEDULER", raising=False)
    monkeypatch.setenv("BERTRACE_ENGINE", "dask")  # the environment selects the engine
    man = generate_examples(
        corpus / "train.txt",
        corpus / "valid.txt",
        corpus / "tokenizer.json",
        tmp_path,
        CFG,
        engine=Engine.from_params({"workers": 2}, "examples"),
        progress=False,
    )
    assert _shard_hashes(tmp_path, man) == _shard_hashes(*local_run)


def test_engine_from_params_and_environment(monkeypatch):
    monkeypatch.delenv("BERTRACE_ENGINE", raising=False)
    monkeypatch.delenv("BERTRACE_DASK_SCHEDULER", raising=False)
    assert Engine.from_params({}, "examples") == Engine("local", 0, None)
    assert Engine.from_params({"engine": "dask", "dask_scheduler": "tcp://a:8786", "workers": 3}, "examples") == Engine(
        "dask", 3, "tcp://a:8786"
    )
    monkeypatch.setenv("BERTRACE_ENGINE", "dask")
    monkeypatch.setenv("BERTRACE_DASK_SCHEDULER", "tcp://b:8786")
    assert Engine.from_params({"engine": "local", "dask_scheduler": "tcp://a:8786"}, "examples") == Engine(
        "dask", 0, "tcp://b:8786"
    )
    monkeypatch.setenv("BERTRACE_ENGINE", "spark")
    with pytest.raises(BertraceError, match=r"examples\.engine = 'spark'.*must be one of local, dask"):
        Engine.from_params({}, "examples")
    monkeypatch.delenv("BERTRACE_ENGINE")
    with pytest.raises(BertraceError, match=r"examples\.workers = -1: must be an integer >= 0"):
        Engine.from_params({"workers": -1}, "examples")


def test_worker_with_other_code_refuses_to_run(corpus):
    text = (corpus / "tokenizer.json").read_text()
    with pytest.raises(BertraceError, match="other bertrace code or library versions"):
        _partition_task((text, "sha", CFG, "0" * 64, False), "train", 0, ["a b. c d.", "e f. g h."], 1)
    shards = _partition_task((text, "sha", CFG, code_fingerprint(), False), "train", 0, ["a b. c d.", "e f. g h."], 1)
    assert len(shards) == 1 and shards[0][1][:4] == b"PAR1"


def test_examples_config_ignores_engine_keys():
    cfg = ExamplesConfig.from_params({"workers": 2, "engine": "dask", "dask_scheduler": "tcp://x:1", "seed": 4})
    assert cfg.seed == 4 and np.isscalar(cfg.dupe_factor)


def test_dvc_tracks_exactly_the_recipe_params():
    """dvc.yaml lists every ExamplesConfig field, and none of the engine keys (they never change the bytes)."""
    import yaml

    from pipeline.data.examples import ENGINE_KEYS

    repo = Path(__file__).resolve().parents[2]
    listed = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]["examples"]["params"]
    recipe = [name for name in ExamplesConfig.model_fields if name not in ENGINE_KEYS]
    assert sorted(listed) == sorted(f"examples.{name}" for name in recipe)
    section = yaml.safe_load((repo / "params.yaml").read_text())["examples"]
    assert ExamplesConfig.from_params(section) and Engine.from_params(section, "examples").kind in ("local", "dask")
