"""The tokenizer's document sample: seeded, whole lines, at most the stated bytes, in file order."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from pipeline.data.sampling import document_sample, line_ends, sample_documents


def _corpus(path, n=2000, seed=3):
    rng = np.random.default_rng(seed)
    lines = [f"doc {i} " + "wörd " * int(rng.integers(1, 80)) for i in range(n)]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return lines


def test_line_ends_match_the_file(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"ab\n\nc\xc3\xa9\nlast")  # an empty line and a last line without a newline
    assert line_ends(p).tolist() == [3, 4, 8, 12]
    (tmp_path / "e.txt").write_bytes(b"")
    assert line_ends(tmp_path / "e.txt").tolist() == []


def test_sample_is_whole_lines_in_order_within_budget(tmp_path):
    lines = _corpus(tmp_path / "train.txt")
    info = sample_documents(tmp_path / "train.txt", tmp_path / "s.txt", max_bytes=20_000, seed=0)
    got = (tmp_path / "s.txt").read_text(encoding="utf-8").splitlines()
    assert info["sampled"] and info["documents"] == len(got) and info["bytes"] == (tmp_path / "s.txt").stat().st_size
    assert 19_000 < info["bytes"] <= 20_000  # lines of <= ~500 bytes: the budget is filled to within one line
    index = [lines.index(line) for line in got]
    assert index == sorted(index) and len(set(index)) == len(index)  # file order, no repeats
    assert info["of_documents"] == 2000 and info["of_bytes"] == (tmp_path / "train.txt").stat().st_size
    # spread over the file, not its head
    assert max(index) > 1500 and min(index) < 500


def test_sample_depends_on_seed_and_bytes_only(tmp_path):
    _corpus(tmp_path / "train.txt")

    def digest(seed, out):
        sample_documents(tmp_path / "train.txt", tmp_path / out, max_bytes=30_000, seed=seed)
        return hashlib.sha256((tmp_path / out).read_bytes()).hexdigest()

    assert digest(0, "a") == digest(0, "b")
    assert digest(0, "a") != digest(1, "c")


def test_small_file_is_its_own_sample(tmp_path):
    _corpus(tmp_path / "train.txt", n=20)
    size = (tmp_path / "train.txt").stat().st_size
    info = sample_documents(tmp_path / "train.txt", tmp_path / "s.txt", max_bytes=size, seed=0)
    assert not info["sampled"] and info["path"] == tmp_path / "train.txt" and info["bytes"] == size
    assert not (tmp_path / "s.txt").exists()


def test_document_sample_removes_its_file(tmp_path):
    _corpus(tmp_path / "train.txt")
    with document_sample(tmp_path / "train.txt", max_bytes=5_000, seed=0) as info:
        path = info["path"]
        assert path.exists() and path.name == "train.txt" and path.parent != tmp_path
    assert not path.exists()


@pytest.mark.parametrize("budget", [1, 10])
def test_budget_below_one_document_gives_an_empty_sample(tmp_path, budget):
    _corpus(tmp_path / "train.txt", n=50)
    info = sample_documents(tmp_path / "train.txt", tmp_path / "s.txt", max_bytes=budget, seed=0)
    assert info["documents"] == 0 and (tmp_path / "s.txt").read_bytes() == b""
