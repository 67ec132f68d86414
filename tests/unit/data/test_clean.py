"""Clean stage library: article reconstruction per format, normalisation, dedup, train/valid split."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.data.clean import CHUNK_CHARS, DASK_CHUNK_CHARS, clean_corpus, split_score, wikitext_heading
from pipeline.data.download import download_corpus
from tests.conftest import REPO, shared_file

WIKITEXT = (
    " \n"
    " = Alpha Beta = \n"
    " \n"
    " Alpha is a 1 @,@ 000 @-@ year @-@ old thing , 3 @.@ 5 m long . \n"
    " \n"
    " = = History = = \n"
    " \n"
    " It began . \n"
    " = x = \n"  # formula fragment inside a paragraph: not a heading
    " more text \n"
    " \n"
    " = = = Later years = = = \n"
    " \n"
    " Ended in 1990 \n"
    " \n"
    " = Who Framed It ? = \n"  # already ends a sentence: no extra "."
    " \n"
    " Gamma\ttext\u2028with   odd  whitespace . \n"
    " \n"
)
WIKITEXT_ARTICLES = [
    "Alpha Beta. Alpha is a 1,000-year-old thing , 3.5 m long . History. It began . = x = more text "
    "Later years. Ended in 1990",
    "Who Framed It ? Gamma text with odd whitespace .",
]

WIKIEXTRACTOR = (
    '<doc id="12" url="http://en.wikipedia.org/wiki?curid=12" title="Anarchism">\n'
    "Anarchism\n"
    "\n"
    "Anarchism is a political philosophy.\n"
    "History.\n"
    "It began in 1840.\n"
    "</doc>\n"
    '<doc id="25" url="http://en.wikipedia.org/wiki?curid=25" title="Autism">\n'
    "Autism\n"
    "\n"
    "Autism is a disorder.\n"
    "</doc>\n"
)
WIKIEXTRACTOR_ARTICLES = [
    "Anarchism. Anarchism is a political philosophy. History. It began in 1840.",
    "Autism. Autism is a disorder.",
]


def raw_from_file(tmp_path: Path, name: str, content: str, fmt: str = "auto") -> Path:
    src = tmp_path / "src" / name
    src.parent.mkdir(exist_ok=True)
    src.write_text(content, encoding="utf-8")
    out = tmp_path / "raw"
    download_corpus({"source": "local", "local": {"path": str(src), "format": fmt}}, out, progress=False)
    return out


def raw_from_docs(tmp_path: Path, docs: list[str], name: str = "raw") -> Path:
    src = tmp_path / f"{name}.parquet"
    pq.write_table(pa.table({"text": docs}), src)
    out = tmp_path / name
    download_corpus({"source": "local", "local": {"path": str(src), "format": "documents"}}, out, progress=False)
    return out


def lines(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    return text.splitlines() if text else []


def all_lines(out: Path) -> list[str]:
    return lines(out / "train.txt") + lines(out / "valid.txt")


def clean(raw: Path, out: Path, *, min_chars=0, valid_fraction=0.0, seed=0) -> dict:
    return clean_corpus(raw, out, min_chars=min_chars, valid_fraction=valid_fraction, seed=seed, progress=False)


# -- formats ------------------------------------------------------------------------------------
def test_wikitext_heading_levels():
    assert wikitext_heading(" = Valkyria Chronicles III = \n") == (1, "Valkyria Chronicles III")
    assert wikitext_heading(" = = Gameplay = = ") == (2, "Gameplay")
    assert wikitext_heading(" = = = Sub = = = ") == (3, "Sub")
    assert wikitext_heading(" = = Broken = ") is None
    assert wikitext_heading(" Robert is = happy = ") is None
    assert wikitext_heading(" ") is None


def test_wikitext_articles_exact(tmp_path):
    raw = raw_from_file(tmp_path, "wiki.test.raw", WIKITEXT)
    stats = clean(raw, tmp_path / "clean")
    assert sorted(all_lines(tmp_path / "clean")) == sorted(WIKITEXT_ARTICLES)
    assert stats["documents"] == 2 and stats["dropped_short"] == stats["dropped_duplicate"] == 0


def test_wikitext_articles_do_not_span_files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.raw").write_text(" = A = \n \n First part . \n", encoding="utf-8")
    (src / "b.raw").write_text(" continued here ? \n \n = B = \n \n Second . \n", encoding="utf-8")
    download_corpus({"source": "local", "local": {"path": str(src)}}, tmp_path / "raw", progress=False)
    clean(tmp_path / "raw", tmp_path / "clean")
    assert sorted(all_lines(tmp_path / "clean")) == ["A. First part .", "B. Second .", "continued here ?"]


def test_wikiextractor_articles_exact(tmp_path):
    raw = raw_from_file(tmp_path, "wiki_00", "stray line outside docs\n" + WIKIEXTRACTOR)
    stats = clean(raw, tmp_path / "clean")
    assert sorted(all_lines(tmp_path / "clean")) == sorted(WIKIEXTRACTOR_ARTICLES)
    assert stats["documents"] == 2


def test_documents_br_tags_and_whitespace(tmp_path):
    raw = raw_from_docs(
        tmp_path, ["Great film.<br /><br />Loved it.<BR>The end.", "Tabs\tand\nnew\r\nlines\u2029here ", "   ", ""]
    )
    stats = clean(raw, tmp_path / "clean")
    assert sorted(all_lines(tmp_path / "clean")) == ["Great film. Loved it. The end.", "Tabs and new lines here"]
    assert stats["documents"] == 4 and stats["dropped_short"] == 2  # the empty ones (min_chars=0 keeps nothing empty)


def test_documents_from_blank_line_txt_and_jsonl(tmp_path):
    raw = raw_from_file(tmp_path, "docs.txt", "First doc\nline two\n\nSecond doc\n")
    clean(raw, tmp_path / "clean")
    assert sorted(all_lines(tmp_path / "clean")) == ["First doc line two", "Second doc"]
    raw = raw_from_file(tmp_path, "docs.jsonl", '{"text": "J one"}\n{"text": "J two"}\n')
    clean(raw, tmp_path / "clean")
    assert sorted(all_lines(tmp_path / "clean")) == ["J one", "J two"]


# -- normalisation, filters ---------------------------------------------------------------------
def test_nfc_makes_composed_and_decomposed_equal_then_duplicate_dropped(tmp_path):
    composed, decomposed = "Un café au lait.", "Un cafe\u0301 au lait."
    assert composed != decomposed and unicodedata.normalize("NFC", decomposed) == composed
    raw = raw_from_docs(tmp_path, [decomposed, "Other text.", composed, "Other   text. "])
    stats = clean(raw, tmp_path / "clean")
    assert sorted(all_lines(tmp_path / "clean")) == ["Other text.", composed]
    assert stats["dropped_duplicate"] == 2
    assert "e\u0301" not in (tmp_path / "clean" / "train.txt").read_text(encoding="utf-8")


def test_min_chars_boundary(tmp_path):
    raw = raw_from_docs(tmp_path, ["x" * 9, "y" * 10, "z" * 11, "  " + "w" * 9 + "  "])
    stats = clean(raw, tmp_path / "clean", min_chars=10)
    assert sorted(all_lines(tmp_path / "clean")) == ["y" * 10, "z" * 11]
    assert stats["dropped_short"] == 2  # length is measured after normalisation (stripped)


def test_stats_counts(tmp_path):
    docs = [f"doc {i} has five words" for i in range(20)] + ["doc 0 has five words", "tiny"]
    raw = raw_from_docs(tmp_path, docs)
    stats = clean(raw, tmp_path / "clean", min_chars=5, valid_fraction=0.3, seed=1)
    assert stats["documents"] == 22 and stats["dropped_short"] == 1 and stats["dropped_duplicate"] == 1
    for split in ("train", "valid"):
        kept = lines(tmp_path / "clean" / f"{split}.txt")
        assert stats[f"{split}_documents"] == len(kept)
        assert stats[f"{split}_chars"] == sum(map(len, kept))
        assert stats[f"{split}_words"] == 5 * len(kept)
    assert stats["train_documents"] + stats["valid_documents"] == 20


# -- split --------------------------------------------------------------------------------------
def docs_n(n: int) -> list[str]:
    return [f"Document number {i} about topic {i * 7 % 13}." for i in range(n)]


def test_split_deterministic_disjoint_and_stable_under_added_documents(tmp_path):
    raw200 = raw_from_docs(tmp_path, docs_n(200), "raw200")
    s1 = clean(raw200, tmp_path / "c1", valid_fraction=0.1, seed=7)
    s2 = clean(raw200, tmp_path / "c2", valid_fraction=0.1, seed=7)
    for name in ("train.txt", "valid.txt"):
        assert sha256_file(tmp_path / "c1" / name) == sha256_file(tmp_path / "c2" / name)
    assert s1 == s2
    train, valid = set(lines(tmp_path / "c1" / "train.txt")), set(lines(tmp_path / "c1" / "valid.txt"))
    assert not train & valid and train | valid == set(docs_n(200))
    assert 5 <= len(valid) <= 40  # ~10 % of 200
    assert valid == {d for d in docs_n(200) if split_score(d, 7) < 0.1}

    # 100 more documents (and the old ones shuffled): every old document stays on its side
    raw300 = raw_from_docs(tmp_path, docs_n(300)[::-1], "raw300")
    clean(raw300, tmp_path / "c3", valid_fraction=0.1, seed=7)
    train3, valid3 = set(lines(tmp_path / "c3" / "train.txt")), set(lines(tmp_path / "c3" / "valid.txt"))
    assert train <= train3 and valid <= valid3

    # another seed gives another split
    clean(raw200, tmp_path / "c4", valid_fraction=0.1, seed=8)
    assert set(lines(tmp_path / "c4" / "valid.txt")) != valid


def test_split_guarantees_one_document_per_side(tmp_path):
    raw = raw_from_docs(tmp_path, ["first document", "second document", "third document"])
    s = clean(raw, tmp_path / "none_valid", valid_fraction=0.0)
    assert s["valid_documents"] == 1 and s["train_documents"] == 2
    moved = lines(tmp_path / "none_valid" / "valid.txt")
    # the train document closest to the threshold (lowest score) moves, deterministically
    assert moved == [min(["first document", "second document", "third document"], key=lambda d: split_score(d, 0))]
    assert len(lines(tmp_path / "none_valid" / "train.txt")) == 2

    s = clean(raw, tmp_path / "all_valid", valid_fraction=0.999999)
    assert s["train_documents"] == 1 and s["valid_documents"] == 2

    single = raw_from_docs(tmp_path, ["only document"], "single")
    s = clean(single, tmp_path / "single_out", valid_fraction=0.0)
    assert s["train_documents"] == 1 and s["valid_documents"] == 0
    assert (tmp_path / "single_out" / "valid.txt").read_text() == ""


def test_outputs_written_atomically_and_replaced(tmp_path):
    raw = raw_from_docs(tmp_path, docs_n(10))
    out = tmp_path / "clean"
    clean(raw, out)
    clean(raw, out)
    assert sorted(p.name for p in out.iterdir()) == ["train.txt", "valid.txt"]  # no temp files left


# -- errors -------------------------------------------------------------------------------------
def test_empty_result_error(tmp_path):
    raw = raw_from_docs(tmp_path, ["short", "tiny"])
    with pytest.raises(BertraceError) as e:
        clean(raw, tmp_path / "clean", min_chars=100)
    msg = str(e.value)
    assert str(raw) in msg and "clean.min_chars" in msg and "download" in msg and "2 shorter" in msg
    assert not (tmp_path / "clean" / "train.txt").exists()


def test_missing_raw_and_bad_params(tmp_path):
    with pytest.raises(BertraceError, match=r"manifest\.json: not found; run the download stage"):
        clean(tmp_path / "nothing", tmp_path / "clean")
    raw = raw_from_docs(tmp_path, docs_n(3))
    (raw / "part-00000.parquet").unlink()
    with pytest.raises(BertraceError, match=r"part-00000\.parquet: listed in .* but missing; rerun the download"):
        clean(raw, tmp_path / "clean")
    with pytest.raises(BertraceError, match=r"clean\.valid_fraction is 1\.5"):
        clean(raw, tmp_path / "clean", valid_fraction=1.5)
    (raw / "manifest.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(BertraceError, match=r"manifest\.json: not valid JSON"):
        clean(raw, tmp_path / "clean")


# -- real data slices ---------------------------------------------------------------------------
def test_real_wikitext2_test_split_has_60_articles(tmp_path, monkeypatch):
    shared_file("wikitext-2-raw", "wiki.test.raw")
    monkeypatch.chdir(REPO)
    params = {
        "source": "hub",
        "hub": {
            "dataset": "Salesforce/wikitext",
            "config": "wikitext-2-raw-v1",
            "splits": ["test"],
            "format": "wikitext",
        },
    }
    download_corpus(params, tmp_path / "raw", mirror="mirrors/shared-data.yaml", progress=False)
    stats = clean(tmp_path / "raw", tmp_path / "clean", min_chars=200, valid_fraction=0.05)
    assert stats["documents"] == 60  # WikiText-2's test split is 60 Wikipedia articles
    text = all_lines(tmp_path / "clean")
    first = next(t for t in text if t.startswith("Robert Boulter."))
    assert first.startswith(
        "Robert Boulter. Robert Boulter is an English film , television and theatre actor . "
        "He had a guest-starring role on the television series The Bill in 2000 ."
    )
    assert " Career. " in first and " @-@ " not in "".join(text)


def test_real_wikiextractor_file(tmp_path):
    src = shared_file("enwiki-extract", "AA", "wiki_00")
    n_docs = src.read_text(encoding="utf-8").count("<doc ")
    download_corpus({"source": "local", "local": {"path": str(src)}}, tmp_path / "raw", progress=False)
    manifest = json.loads((tmp_path / "raw" / "manifest.json").read_text())
    assert manifest["format"] == "wikiextractor"
    stats = clean(tmp_path / "raw", tmp_path / "clean", min_chars=0, valid_fraction=0.05)
    assert stats["documents"] == n_docs
    text = all_lines(tmp_path / "clean")
    assert any(t.startswith("Anarchism. Anarchism is a political philosophy") for t in text)
    assert not any("<doc" in t or "</doc>" in t for t in text)


# -- parallel cleaning: same bytes for any number of workers and any chunking --------------------------
def test_chunks_cut_only_between_articles(tmp_path):
    """chunk_chars=1 cuts at every point the chunker thinks safe; the articles must not change."""
    for name, content, expected in (
        ("wiki.test.raw", WIKITEXT, WIKITEXT_ARTICLES),
        ("wiki_00", WIKIEXTRACTOR, WIKIEXTRACTOR_ARTICLES),
    ):
        (tmp_path / name).mkdir()
        raw = raw_from_file(tmp_path / name, name, content)
        stats = clean_corpus(
            raw,
            tmp_path / name / "clean",
            min_chars=0,
            valid_fraction=0.0,
            seed=0,
            workers=1,
            chunk_chars=1,
            progress=False,
        )
        assert sorted(all_lines(tmp_path / name / "clean")) == sorted(expected)
        assert stats["documents"] == len(expected)


def _real_slice(tmp_path: Path, source: str) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    if source == "wikitext":
        (src / "wiki.test.raw").write_bytes(shared_file("wikitext-2-raw", "wiki.test.raw").read_bytes())
    else:
        for name in ("wiki_00", "wiki_01"):
            (src / name).write_bytes(shared_file("enwiki-extract", "AA", name).read_bytes())
        # a duplicate article across chunks and files: dedup must keep the first one whatever the workers
        docs = (src / "wiki_00").read_bytes().split(b"</doc>\n")
        (src / "wiki_02").write_bytes(b"</doc>\n".join(docs[:3]) + b"</doc>\n")
    download_corpus({"source": "local", "local": {"path": str(src)}}, tmp_path / "raw", progress=False)
    return tmp_path / "raw"


@pytest.mark.parametrize("source", ["wikitext", "enwiki"])
def test_workers_and_chunking_write_identical_bytes(tmp_path, source):
    raw = _real_slice(tmp_path, source)
    runs = {}
    for workers, chunk_chars in ((1, 1 << 40), (1, 20_000), (2, 20_000)):  # (1, 1 << 40): one chunk, no cut
        out = tmp_path / f"clean-{workers}-{chunk_chars}"
        stats = clean_corpus(
            raw,
            out,
            min_chars=200,
            valid_fraction=0.1,
            seed=0,
            workers=workers,
            chunk_chars=chunk_chars,
            progress=False,
        )
        runs[workers, chunk_chars] = (stats, sha256_file(out / "train.txt"), sha256_file(out / "valid.txt"))
    (first, *others) = runs.values()
    assert all(r == first for r in others), runs
    stats = first[0]
    assert stats["train_documents"] > 10 and stats["valid_documents"] > 0
    assert (stats["dropped_duplicate"] > 0) == (source == "enwiki")


def test_dask_engine_writes_the_same_bytes(tmp_path):
    pytest.importorskip("distributed", reason="pip install 'bertrace[dask]'")
    raw = _real_slice(tmp_path, "enwiki")
    local = clean_corpus(raw, tmp_path / "local", min_chars=200, valid_fraction=0.1, seed=0, workers=1, progress=False)
    dask = clean_corpus(
        raw,
        tmp_path / "dask",
        min_chars=200,
        valid_fraction=0.1,
        seed=0,
        workers=2,
        engine="dask",
        chunk_chars=50_000,
        progress=False,
    )  # no address: a 2-worker LocalCluster
    assert dask == local
    for name in ("train.txt", "valid.txt"):
        assert sha256_file(tmp_path / "dask" / name) == sha256_file(tmp_path / "local" / name)


def test_bad_workers_or_engine_error(tmp_path):
    raw = raw_from_file(tmp_path, "wiki.test.raw", WIKITEXT)
    with pytest.raises(BertraceError, match=r"clean\.workers = -1: must be an integer >= 0"):
        clean_corpus(raw, tmp_path / "clean", min_chars=0, valid_fraction=0.1, seed=0, workers=-1, progress=False)
    with pytest.raises(BertraceError, match=r"clean\.engine = 'spark'"):
        clean_corpus(raw, tmp_path / "clean", min_chars=0, valid_fraction=0.1, seed=0, engine="spark", progress=False)


@pytest.mark.parametrize("engine, size", [("local", CHUNK_CHARS), ("dask", DASK_CHUNK_CHARS)])
def test_dask_tasks_take_bigger_chunks(tmp_path, monkeypatch, engine, size):
    """A Dask task costs the cluster ~10 ms of CPU: its chunks are 32x the local engine's."""
    import pipeline.data.clean as clean

    src = tmp_path / "src"
    src.mkdir()
    article = "<doc id='{i}'>\nTitle {i}\n" + "word " * 2000 + "{i}\n</doc>\n"
    (src / "wiki_00").write_text("".join(article.format(i=i) for i in range(4000)), encoding="utf-8")
    download_corpus({"source": "local", "local": {"path": str(src)}}, tmp_path / "raw", progress=False)
    sizes = []

    def run_here(fn, shared, tasks, engine, **kw):  # in this process, recording each chunk's size
        for (rows,) in tasks:
            sizes.append(sum(len(text) for text, _ in rows))
            yield (rows,), fn(shared, rows)

    monkeypatch.setattr(clean, "run_tasks", run_here)
    stats = clean_corpus(
        tmp_path / "raw", tmp_path / "out", min_chars=200, valid_fraction=0.1, seed=0, engine=engine, progress=False
    )
    assert stats["documents"] == 4000
    assert size <= max(sizes) < size + 10_100 and len(sizes) == -(-sum(sizes) // max(sizes))
