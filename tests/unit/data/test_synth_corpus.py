"""bench/synth_corpus.py: a WikiExtractor corpus with Zipf frequencies and Heaps vocabulary growth,
deterministic per seed, that the pipeline's download and clean stages read article for article."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pipeline.data.sentences import split_sentences

REPO = Path(__file__).resolve().parents[3]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


synth = _load("synth_corpus")


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _text_lines(root: Path):
    """The title and paragraph lines (no <doc> markup, no blank lines)."""
    for f in sorted(p for p in root.rglob("wiki_*")):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line and not line.startswith(("<doc ", "</doc>")):
                yield line


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """4 MB and 16 MB of the same seed, with their statistics and word counts."""
    out = {}
    for mb in (4, 16):
        root = tmp_path_factory.mktemp(f"synth{mb}")
        stats = synth.write_corpus(root, mb * 10**6, seed=0, file_bytes=6 << 20)
        words = Counter()
        for line in _text_lines(root):
            words.update(line.split())
        out[mb] = {"root": root, "stats": stats, "words": words}
    return out


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    digests = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        stats = synth.write_corpus(tmp_path / name, 300_000, seed=seed)
        digests.append(_digest(tmp_path / name))
        assert stats["bytes"] == sum(f.stat().st_size for f in (tmp_path / name).rglob("wiki_*"))
    assert digests[0] == digests[1]
    assert digests[0] != digests[2]


def test_files_are_wikiextractor_output(corpora):
    c = corpora[16]
    files = sorted(p.relative_to(c["root"]).as_posix() for p in c["root"].rglob("*") if p.is_file())
    assert files == ["AA/wiki_00", "AA/wiki_01", "AA/wiki_02"]
    assert c["stats"]["files"] == 3
    text = (c["root"] / "AA" / "wiki_00").read_text(encoding="utf-8")
    first = text.split("\n", 3)
    title = re.fullmatch(r'<doc id="1" url="https://en\.wikipedia\.org/wiki\?curid=1" title="([^"]+)">', first[0])
    assert title and first[1] == title.group(1) and first[2] == ""
    docs = re.findall(r'<doc id="(\d+)" url="[^"]+" title="([^"]+)">\n\1?', text)
    assert text.count("</doc>") == len(docs) and text.endswith("\n\n</doc>\n")
    assert len({t for _, t in docs}) == len(docs)  # titles are unique
    assert c["stats"]["bytes"] / c["stats"]["documents"] == pytest.approx(3100, rel=0.15)  # ~3 KB articles


def test_counts_returned_are_the_texts(corpora):
    """``tokens`` = the words of the title lines and bodies; ``distinct_words`` = their distinct
    lower-cased forms (punctuation stripped)."""
    for c in corpora.values():
        assert sum(c["words"].values()) == c["stats"]["tokens"]
        distinct = {w.strip(".,").lower() for w in c["words"]}
        assert len(distinct) == c["stats"]["distinct_words"]


def test_heaps_law(corpora):
    """Distinct words grow as tokens^beta, beta in [0.5, 0.8], and follow the Pitman–Yor expectation."""
    small, large = corpora[4]["stats"], corpora[16]["stats"]
    beta = math.log(large["distinct_words"] / small["distinct_words"]) / math.log(large["tokens"] / small["tokens"])
    assert 0.5 <= beta <= 0.8, beta
    for s in (small, large):
        assert s["distinct_words"] == pytest.approx(s["expected_distinct_words"], rel=0.06)


def test_zipf_law(corpora):
    """Rank-frequency slope of the 1000 most frequent words on log-log axes in [-1.3, -0.8]."""
    counts = Counter()
    for w, n in corpora[16]["words"].items():
        counts[w.strip(".,").lower()] += n
    top = np.array(sorted(counts.values(), reverse=True)[:1000], float)
    slope = np.polyfit(np.log(np.arange(1, len(top) + 1)), np.log(top), 1)[0]
    assert -1.3 <= slope <= -0.8, slope


def test_expected_types_is_the_pitman_yor_mean():
    # the exact recursion: the (n+1)-th token is new with probability (theta + d K_n) / (theta + n)
    expected = 0.0
    for n in range(2000):
        expected += (230.0 + 0.7 * expected) / (230.0 + n)
    assert synth.expected_types(2000, 0.7, 230.0) == pytest.approx(expected, rel=1e-9)
    assert synth.expected_types(1, 0.7, 230.0) == pytest.approx(1.0)


def test_download_and_clean_read_every_article(tmp_path):
    """Through the pipeline's download (format auto) and clean: every article comes out, bar the
    ones shorter than clean.min_chars, none a duplicate; the sentence splitter cuts at every '.'."""
    corpus = _load("corpus")
    stats = synth.write_corpus(tmp_path / "src", 2 * 10**6, seed=3, file_bytes=1 << 20)
    assert stats["files"] == 2
    manifest = corpus.download(tmp_path / "src", tmp_path / "raw")
    assert manifest["format"] == "wikiextractor"
    clean = corpus.clean(tmp_path / "raw", tmp_path / "clean")
    assert clean["documents"] == stats["documents"]
    assert clean["dropped_duplicate"] == 0
    assert clean["dropped_short"] < 0.1 * stats["documents"]
    assert clean["train_documents"] + clean["valid_documents"] == stats["documents"] - clean["dropped_short"]
    lines = (tmp_path / "clean" / "train.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == clean["train_documents"]
    for line in lines[:200]:
        sentences = split_sentences(line)
        assert len(sentences) == line.count(". ") + 1
        assert all(s.endswith(".") and (s[0].isupper() or s[0].isdigit()) for s in sentences)
