"""Skip-gram embedding initialisation (pipeline/pretrain/wordvec.py, ``pretrain.embedding_init``): the rows it
reads, what the vectors learn, their scale, determinism, and how pre-training records them."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.models import checkpoint as ckpt_lib
from pipeline.pretrain.wordvec import EmbeddingInit, nearest, skipgram_vectors, standardise, training_rows
from tests.support.examples_data import FIRST, VOCAB, make_examples
from tests.support.pretraining import run, tiny_cfg

pytestmark = pytest.mark.usefixtures("one_thread")
CYCLE = VOCAB - FIRST  # the synthetic rows count up through ids FIRST..VOCAB-1 and wrap


@pytest.fixture(scope="module")
def static(tmp_path_factory):
    return make_examples(
        tmp_path_factory.mktemp("wv"), masking="static", train_rows=512, valid_rows=32, rows_per_shard=128, max_len=48
    )


def _manifest(d):
    return json.loads((d / "manifest.json").read_text())


def test_training_rows_put_the_masked_ids_back(static):
    rows = list(training_rows(static, _manifest(static)))
    assert len(rows) == 512
    for row in rows[:100]:
        assert row[0] == 2 and 4 not in row.tolist()  # [CLS] first, no [MASK] left
        first_sep = row.tolist().index(3)
        a = row[1:first_sep]  # segment A counts up by one (mod the cycle): any id left masked breaks the run
        assert all((int(y) - int(x)) % CYCLE == 1 for x, y in zip(a[:-1], a[1:])), row


def test_vectors_learn_which_ids_occur_together_and_are_deterministic(static):
    cfg = EmbeddingInit(
        method="skipgram", window=2, epochs=20, lr=2e-2, subsample=0, batch_rows=64, shared_negatives=16
    )
    vectors, counts, record = skipgram_vectors(static, _manifest(static), 16, cfg)
    assert vectors.shape == (VOCAB, 16) and counts[:FIRST].sum() <= counts[1] + counts[4]  # no [CLS]/[SEP]/[PAD]
    assert record["pairs"] > 0 and record["updates"] == 20 * 8 and 0 < record["loss"] < 4.0
    close = 0
    for i in range(FIRST, VOCAB):
        j = nearest(vectors, i, k=1)[0]
        close += min((j - i) % CYCLE, (i - j) % CYCLE) <= 2  # a neighbour in the counting order
    assert close / CYCLE > 0.8, close
    again, _, _ = skipgram_vectors(static, _manifest(static), 16, cfg)
    assert torch.equal(vectors, again)


def test_standardise_centres_and_scales_the_seen_rows_only():
    v = torch.randn(10, 8) * 3 + 5
    seen = torch.tensor([True] * 7 + [False] * 3)
    out = standardise(v, seen, 0.02)
    assert torch.allclose(out[seen].mean(0), torch.zeros(8), atol=1e-6)
    assert out[seen].std().item() == pytest.approx(0.02, rel=1e-4)
    assert (out[~seen] == 0).all()


def test_pretraining_starts_from_the_vectors_and_records_them(static, tmp_path):
    emb = {"method": "skipgram", "window": 2, "epochs": 2.0, "batch_rows": 64, "shared_negatives": 16}
    cfg = tiny_cfg(max_steps=2, embedding_init=emb)
    metrics, _ = run(cfg, static, tmp_path / "a")
    record = ckpt_lib.load_checkpoint(tmp_path / "a" / "last.pt")["provenance"]["embedding_init"]
    assert record["method"] == "skipgram" and record["updates"] == 16 and record["std"] == 0.02
    assert record["params"]["window"] == 2
    # its time is the run log's (embedding_init_seconds), not the record's
    assert "seconds" not in record and metrics["embedding_init_seconds"] >= 0
    again, _ = run(cfg, static, tmp_path / "b")
    assert again["model_sha256"] == metrics["model_sha256"]  # the same bytes from the same params
    assert sha256_file(tmp_path / "a" / "last.pt") == sha256_file(tmp_path / "b" / "last.pt")
    plain, _ = run(tiny_cfg(max_steps=2), static, tmp_path / "c")
    assert plain["model_sha256"] != metrics["model_sha256"] and "embedding_init_seconds" not in plain


def test_bad_embedding_init_params_are_clear_errors(static, tmp_path):
    with pytest.raises(BertraceError, match=r"embedding_init\.method"):
        tiny_cfg(embedding_init={"method": "glove"})
    with pytest.raises(BertraceError, match=r"embedding_init\.window"):
        tiny_cfg(embedding_init={"method": "skipgram", "window": 0})
    first, _ = run(tiny_cfg(max_steps=2), static, tmp_path / "a")
    with pytest.raises(BertraceError, match="pretrain.init"):
        run(
            tiny_cfg(max_steps=2, init=str(tmp_path / "a" / "last.pt"), embedding_init={"method": "skipgram"}),
            static,
            tmp_path / "b",
        )
