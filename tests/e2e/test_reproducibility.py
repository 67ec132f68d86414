"""Same params + same seed ⇒ the same outputs, across processes (other hash seeds).

Two fresh Python processes run tokenizer → examples → a few CPU pre-training steps on the
same small corpus and report hashes and losses; everything must agree bit for bit. The
end-to-end version (two independent copies of the repo under `dvc repro`, every output of every
stage compared) is ``test_stable_lock.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO

SCRIPT = r"""
import json, sys
from pathlib import Path
import torch
from pipeline.data.examples import ExamplesConfig, generate_examples
from pipeline.core.io import sha256_file
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.loop import pretrain
from pipeline.data.tokenizer_training import train_wordpiece
from tests.support.corpus import write_corpus

out = Path(sys.argv[1])
out.mkdir(parents=True)
torch.set_num_threads(1)
train = write_corpus(out / "train.txt", n_docs=160, seed=1)
valid = write_corpus(out / "valid.txt", n_docs=20, seed=2)
tok = train_wordpiece(train, out / "tokenizer", vocab_size=300, lowercase=True, min_frequency=2, progress=False)
cfg = ExamplesConfig(max_seq_len=64, dupe_factor=2, docs_per_shard=40, row_group_size=32, seed=7)
manifest = generate_examples(train, valid, out / "tokenizer" / "tokenizer.json", out / "examples", cfg,
                             workers=1, progress=False)
files = sorted(p for p in (out / "examples").rglob("*") if p.is_file())
logs = []
model = {"preset": "tiny", "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "max_position": 64}
pcfg = PretrainConfig(objective="mlm_nsp", embedding_init={"method": "random"}, model=model, batch_size=8, lr=3e-3, warmup=0.1, max_steps=8, eval_every=4, eval_batches=2,
                      log_every=1, checkpoint_every=None, checkpoint_minutes=None, shuffle_buffer=64, seed=0,
                      num_threads=1, device="cpu")
metrics = pretrain(pcfg, examples_dir=out / "examples", out_dir=out / "pretrain", provenance={},
                   on_log=lambda step, m: logs.append((step, {k: v for k, v in m.items() if "loss" in k})),
                   progress=False)
print(json.dumps({
    "tokenizer": [tok["tokenizer_sha256"], sha256_file(out / "tokenizer" / "vocab.txt")],
    "examples": {p.relative_to(out).as_posix(): sha256_file(p) for p in files},
    "rows": manifest["splits"]["train"]["rows"],
    "losses": [[s, m] for s, m in logs if m],
    "model_sha256": metrics["model_sha256"],
    "budget": metrics["budget"],
}))
"""


def _run(out, hash_seed: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO), "BERTRACE_NO_MLFLOW": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_same_params_and_seed_give_identical_tokenizer_shards_and_losses(tmp_path):
    a, b = _run(tmp_path / "a", "1"), _run(tmp_path / "b", "2")
    assert a["rows"] > 0 and len(a["examples"]) >= 3  # shards of both splits + manifest
    assert a["tokenizer"] == b["tokenizer"]
    assert a["examples"] == b["examples"]  # every shard and the manifest, byte for byte
    train_losses = [m for _, m in a["losses"] if "loss" in m]
    assert len(train_losses) == 8 and any("val_mlm_loss" in m for _, m in a["losses"])
    assert a["losses"] == b["losses"]  # exact floats, first 8 CPU steps and the validations
    assert a["model_sha256"] == b["model_sha256"]  # the weights, bit for bit
    assert a["budget"]["deterministic"]  # a step budget: what makes the above hold on any machine of this kind
