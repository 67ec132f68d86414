"""The data stages write new files, never into an existing output: with DVC's hardlink or symlink
cache (.dvc/config cache.type) an output IS its cache file, so an in-place write would change the
cached bytes of an earlier run. Here a fake cache stands in for DVC's: each output file is moved to
a read-only object named by its hash and linked back, the stage runs again with other params, and
every object must still hash to its name while the outputs are new, writable files."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.io import atomic_open, sha256_file, write_json
from pipeline.data.clean import clean_corpus
from pipeline.data.download import download_corpus
from pipeline.data.examples import ExamplesConfig, generate_examples
from pipeline.data.tokenizer_training import train_wordpiece
from tests.conftest import REPO
from tests.support.corpus import WORDS

KINDS = ["hardlink", "symlink"]


def link_into_cache(out: Path, cache: Path, kind: str) -> int:
    """Replace every file under ``out`` by a ``kind`` link to a read-only object in ``cache``
    (named by its sha256), as `dvc commit` does with a linking cache.type; the number linked."""
    cache.mkdir(exist_ok=True)
    files = [p for p in sorted(out.rglob("*")) if p.is_file() and not p.is_symlink()]
    for f in files:
        obj = cache / sha256_file(f)
        if obj.exists():
            f.unlink()
        else:
            os.replace(f, obj)
            os.chmod(obj, 0o444)
        if kind == "hardlink":
            os.link(obj, f)
        else:
            f.symlink_to(obj)
    assert files, f"{out}: nothing to link"
    return len(files)


def check_cache_and_fresh(out: Path, cache: Path) -> None:
    """Every cached object still holds its bytes; every file under ``out`` is a new, writable file."""
    assert [o.name for o in cache.iterdir() if sha256_file(o) != o.name] == []
    for p in sorted(out.rglob("*")):
        if p.is_symlink() or p.is_file():
            st = p.lstat()
            assert not p.is_symlink() and st.st_nlink == 1, f"{p}: still a link into the cache"
            assert st.st_mode & stat.S_IWUSR, f"{p}: read-only ({oct(st.st_mode)})"


def test_the_repository_links_outputs_into_the_cache():
    """A hard link, else a symlink (a cache on another filesystem), copy last: DVC takes the first
    that works. Not reflink first: DVC cannot tell a reflink from a copy, so on a filesystem without
    reflinks (ext4) it leaves the files of a directory output as copies after `dvc repro` (x2 disk)."""
    from dvc.config import Config

    repo = Config.validate(Config(dvc_dir=REPO / ".dvc").load_one("repo"))
    assert repo["cache"]["type"] == ["hardlink", "symlink", "copy"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    rng = random.Random(3)
    docs = [
        " ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) + "." for _ in range(rng.randint(4, 9)))
        for _ in range(160)
    ]
    src = tmp_path_factory.mktemp("src") / "docs.parquet"
    pq.write_table(pa.table({"text": docs}), src)
    return src


@pytest.fixture(scope="module")
def corpus(source, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("corpus")
    download_corpus({"source": "local", "local": {"path": str(source), "format": "documents"}}, root / "raw", progress=False)
    clean_corpus(root / "raw", root / "clean", min_chars=0, valid_fraction=0.1, seed=0, workers=1, progress=False)
    train_wordpiece(root / "clean" / "train.txt", root / "tok", vocab_size=200, lowercase=True, min_frequency=0, progress=False)
    return {"train": root / "clean" / "train.txt", "valid": root / "clean" / "valid.txt", "tokenizer": root / "tok" / "tokenizer.json"}


@pytest.mark.parametrize("kind", KINDS)
def test_atomic_writes_replace_a_linked_read_only_file(tmp_path, kind):
    out = tmp_path / "out"
    out.mkdir()
    write_json(out / "a.json", {"v": 1})
    with atomic_open(out / "b.txt") as f:
        f.write("b\n")
    link_into_cache(out, tmp_path / "cache", kind)
    write_json(out / "a.json", {"v": 2})
    with atomic_open(out / "b.txt") as f:
        f.write("b2\n")
    check_cache_and_fresh(out, tmp_path / "cache")
    assert (out / "b.txt").read_text() == "b2\n"


@pytest.mark.parametrize("kind", KINDS)
def test_download_rebuilds_a_linked_output_directory(source, tmp_path, kind):
    out, params = tmp_path / "raw", {"source": "local", "local": {"path": str(source), "format": "documents"}}
    download_corpus(params, out, progress=False)
    link_into_cache(out, tmp_path / "cache", kind)
    download_corpus(params, out, progress=False)
    check_cache_and_fresh(out, tmp_path / "cache")


@pytest.mark.parametrize("kind", KINDS)
def test_clean_replaces_linked_outputs(source, tmp_path, kind):
    raw = tmp_path / "raw"
    download_corpus({"source": "local", "local": {"path": str(source), "format": "documents"}}, raw, progress=False)
    first = clean_corpus(raw, tmp_path / "clean", min_chars=0, valid_fraction=0.1, seed=0, workers=1, progress=False)
    link_into_cache(tmp_path / "clean", tmp_path / "cache", kind)
    # one side ends up empty and a document is moved over (the append path of the split)
    second = clean_corpus(raw, tmp_path / "clean", min_chars=0, valid_fraction=0.0, seed=1, workers=1, progress=False)
    check_cache_and_fresh(tmp_path / "clean", tmp_path / "cache")
    assert second["valid_documents"] == 1 and first["valid_documents"] > 1


@pytest.mark.parametrize("kind", KINDS)
def test_the_tokenizer_replaces_linked_outputs(corpus, tmp_path, kind):
    out = tmp_path / "tok"
    train_wordpiece(corpus["train"], out, vocab_size=200, lowercase=True, min_frequency=0, progress=False)
    assert link_into_cache(out, tmp_path / "cache", kind) == 2
    train_wordpiece(corpus["train"], out, vocab_size=180, lowercase=True, min_frequency=0, progress=False)
    check_cache_and_fresh(out, tmp_path / "cache")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["mlm_nsp", "causal"])
def test_examples_replace_linked_shards(corpus, tmp_path, kind, mode):
    out = tmp_path / "examples"
    cfg = dict(mode=mode, max_seq_len=32, max_predictions_per_seq=3, dupe_factor=1, valid_dupe_factor=1, docs_per_shard=16)
    args = (corpus["train"], corpus["valid"], corpus["tokenizer"], out)
    generate_examples(*args, ExamplesConfig(**cfg, seed=1), workers=1, progress=False)
    n = link_into_cache(out, tmp_path / "cache", kind)
    assert n > 3  # manifest and shards of both splits
    generate_examples(*args, ExamplesConfig(**cfg, seed=2, shuffle_documents=True), workers=1, progress=False)
    check_cache_and_fresh(out, tmp_path / "cache")
