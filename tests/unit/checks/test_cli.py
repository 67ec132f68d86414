"""`bertrace validate DIR`: how CI checks a shard directory (real shards, real GX)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.data.examples import ExamplesConfig, generate_examples
from pipeline.data.tokenizer_training import train_wordpiece
from tests.conftest import REPO, shared_file


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    text = shared_file("enwiki-extract", "AA", "wiki_00").read_text(encoding="utf-8")
    docs = [" ".join(block.split("\n", 2)[-1].split()) for block in text.split("</doc>") if len(block) > 500][:40]
    (root / "train.txt").write_text("\n".join(docs[:32]) + "\n", encoding="utf-8")
    (root / "valid.txt").write_text("\n".join(docs[32:]) + "\n", encoding="utf-8")
    train_wordpiece(root / "train.txt", root / "tok", vocab_size=3000, lowercase=True, min_frequency=2, progress=False)
    cfg = ExamplesConfig(dupe_factor=1, docs_per_shard=12)
    generate_examples(
        root / "train.txt",
        root / "valid.txt",
        root / "tok" / "tokenizer.json",
        root / "ex",
        cfg,
        workers=1,
        progress=False,
    )
    return root / "ex"


def _bertrace(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "stages.cli", *args], env=env, capture_output=True, text=True, cwd=REPO
    )


def test_cli_passes_good_shards(shards):
    proc = _bertrace("validate", str(shards))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "validation passed" in proc.stdout


def test_cli_fails_on_a_tampered_shard_naming_file_and_hashes(shards, tmp_path):
    import shutil

    bad = tmp_path / "ex"
    shutil.copytree(shards, bad)
    shard = sorted((bad / "train").glob("*.parquet"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    proc = _bertrace("validate", str(bad))
    assert proc.returncode == 1
    assert shard.name in proc.stdout and "sha256" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_cli_missing_directory_is_a_clear_failure(tmp_path):
    proc = _bertrace("validate", str(tmp_path / "nope"))
    assert proc.returncode != 0
    assert "manifest.json" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
