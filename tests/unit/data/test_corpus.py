"""Download stage library: local sources, hub mirrors, output parts and manifest, user errors."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.data import download as corpus
from pipeline.data.download import download_corpus, list_source_files
from pipeline.data.hub import is_network_error, resolve_mirror
from tests.conftest import REPO, shared_file

WIKITEXT = (
    " \n"
    " = Alpha Beta = \n"
    " \n"
    " Alpha is a 1 @,@ 000 @-@ year @-@ old thing . \n"
    " \n"
    " = = History = = \n"
    " \n"
    " It began . \n"
    " \n"
    " = Gamma = \n"
    " \n"
    " Gamma text . \n"
)

WIKIEXTRACTOR = (
    '<doc id="1" url="http://en.wikipedia.org/wiki?curid=1" title="Anarchism">\n'
    "Anarchism\n"
    "\n"
    "Anarchism is a political philosophy.\n"
    "</doc>\n"
    '<doc id="2" url="http://en.wikipedia.org/wiki?curid=2" title="Autism">\n'
    "Autism\n"
    "\n"
    "Autism is a disorder.\n"
    "</doc>\n"
)


def local(path, fmt="auto", text_column="text") -> dict:
    return {"source": "local", "local": {"path": str(path), "format": fmt, "text_column": text_column}}


def hub(
    splits=("train", "validation", "test"), dataset="Salesforce/wikitext", config="wikitext-2-raw-v1", fmt="wikitext"
) -> dict:
    return {
        "source": "hub",
        "hub": {
            "dataset": dataset,
            "config": config,
            "revision": "main",
            "splits": list(splits),
            "text_column": "text",
            "format": fmt,
        },
    }


def read_rows(out: Path) -> list[tuple[str, str]]:
    manifest = json.loads((out / "manifest.json").read_text())
    rows = []
    for part in manifest["parts"]:
        t = pq.read_table(out / part["path"])
        rows += list(zip(t.column("text").to_pylist(), t.column("source").to_pylist()))
    return rows


# -- local sources ------------------------------------------------------------------------------
def test_local_wikitext_file_rows_manifest_and_identical_reruns(tmp_path):
    src = tmp_path / "wiki.test.raw"
    src.write_text(WIKITEXT, encoding="utf-8")
    m1 = download_corpus(local(src), tmp_path / "raw1", progress=False)
    m2 = download_corpus(local(src), tmp_path / "raw2", progress=False)

    assert m1["format"] == "wikitext"
    assert m1["total_rows"] == WIKITEXT.count("\n") == 12
    assert m1["source"]["files"] == [
        {"path": src.as_posix(), "sha256": sha256_file(src), "bytes": src.stat().st_size, "rows": 12}
    ]
    assert m1["rows"] == {src.as_posix(): 12}
    rows = read_rows(tmp_path / "raw1")
    # raw lines without their line ending; blank lines stored as "" (Hugging Face's WikiText rows)
    assert [t for t, _ in rows][:4] == ["", " = Alpha Beta = ", "", " Alpha is a 1 @,@ 000 @-@ year @-@ old thing . "]
    assert {s for _, s in rows} == {src.as_posix()}
    # no timestamps: a rerun gives byte-identical parts and manifest
    for name in ("manifest.json", "part-00000.parquet"):
        assert sha256_file(tmp_path / "raw1" / name) == sha256_file(tmp_path / "raw2" / name)
    assert m1["parts"][0]["sha256"] == sha256_file(tmp_path / "raw1" / "part-00000.parquet")
    assert m2 == m1
    assert (
        pq.ParquetFile(tmp_path / "raw1" / "part-00000.parquet").metadata.row_group(0).column(0).compression == "ZSTD"
    )


def test_local_directory_recursive_sorted_hidden_and_unsupported_skipped(tmp_path):
    root = tmp_path / "src"
    (root / "AB").mkdir(parents=True)
    (root / "AA").mkdir()
    (root / ".git").mkdir()
    (root / "AB" / "wiki_00").write_text(WIKIEXTRACTOR, encoding="utf-8")
    (root / "AA" / "wiki_01").write_text(WIKIEXTRACTOR, encoding="utf-8")
    (root / "AA" / "wiki_00").write_text(WIKIEXTRACTOR, encoding="utf-8")
    (root / "AA" / ".hidden").write_text("<doc>secret</doc>\n", encoding="utf-8")
    (root / ".git" / "wiki_99").write_text(WIKIEXTRACTOR, encoding="utf-8")
    (root / "README.md").write_text("# notes\n", encoding="utf-8")

    files, skipped = list_source_files(root)
    assert [f.relative_to(root).as_posix() for f in files] == ["AA/wiki_00", "AA/wiki_01", "AB/wiki_00"]
    assert [s.name for s in skipped] == ["README.md"]

    m = download_corpus(local(root), tmp_path / "raw", progress=False)
    assert m["format"] == "wikiextractor"
    assert m["total_rows"] == 3 * WIKIEXTRACTOR.count("\n")
    assert [f["path"] for f in m["source"]["files"]] == [f.as_posix() for f in files]
    assert m["source"]["skipped"] == [(root / "README.md").as_posix()]
    sources = [s for _, s in read_rows(tmp_path / "raw")]
    assert sources[0].endswith("AA/wiki_00") and sources[-1].endswith("AB/wiki_00")


def test_local_glob(tmp_path):
    for name in ("b.txt", "a.txt", "c.jsonl"):
        (tmp_path / name).write_text("doc one\n\ndoc two\n", encoding="utf-8")
    m = download_corpus(local(tmp_path / "*.txt"), tmp_path / "raw", progress=False)
    assert [Path(f["path"]).name for f in m["source"]["files"]] == ["a.txt", "b.txt"]
    assert m["format"] == "documents" and m["total_rows"] == 4
    with pytest.raises(BertraceError, match=r"matches no files"):
        download_corpus(local(tmp_path / "*.parquet"), tmp_path / "raw2", progress=False)


def test_documents_parquet_jsonl_and_blank_line_txt(tmp_path):
    pq.write_table(
        pa.table({"review": ["Great film.<br /><br />Loved it.", None, "Bad."], "label": [1, 0, 0]}),
        tmp_path / "imdb.parquet",
    )
    m = download_corpus(local(tmp_path / "imdb.parquet", text_column="review"), tmp_path / "raw_pq", progress=False)
    assert m["format"] == "documents"
    assert [t for t, _ in read_rows(tmp_path / "raw_pq")] == ["Great film.<br /><br />Loved it.", "", "Bad."]

    (tmp_path / "docs.jsonl").write_text(
        '{"text": "first doc", "id": 1}\n\n{"text": "second\\ndoc"}\n', encoding="utf-8"
    )
    download_corpus(local(tmp_path / "docs.jsonl"), tmp_path / "raw_jl", progress=False)
    assert [t for t, _ in read_rows(tmp_path / "raw_jl")] == ["first doc", "second\ndoc"]

    (tmp_path / "docs.txt").write_text("\nPara one line one\nline two\n\n\n  \nPara two\n", encoding="utf-8")
    m = download_corpus(local(tmp_path / "docs.txt"), tmp_path / "raw_txt", progress=False)
    assert m["format"] == "documents"
    assert [t for t, _ in read_rows(tmp_path / "raw_txt")] == ["Para one line one\nline two", "Para two"]


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("wiki_00", WIKIEXTRACTOR, "wikiextractor"),
        ("corpus.txt", WIKITEXT, "wikitext"),
        ("wiki.valid.raw", "plain words without headings\n", "wikitext"),  # .raw is WikiText's own extension
        ("notes.txt", "Just some text.\n\nAnother document.\n", "documents"),
    ],
)
def test_auto_format_detection(tmp_path, name, content, expected):
    (tmp_path / name).write_text(content, encoding="utf-8")
    assert download_corpus(local(tmp_path / name), tmp_path / "raw", progress=False)["format"] == expected


def test_auto_detects_wikitext_rows_in_parquet(tmp_path):
    rows = ["", " = Valkyria Chronicles III = \n", "", " Senjō no Valkyria 3 . \n"]
    pq.write_table(pa.table({"text": rows}), tmp_path / "test-00000-of-00001.parquet")
    m = download_corpus(local(tmp_path), tmp_path / "raw", progress=False)
    assert m["format"] == "wikitext"
    assert [t for t, _ in read_rows(tmp_path / "raw")] == [
        "",
        " = Valkyria Chronicles III = ",
        "",
        " Senjō no Valkyria 3 . ",
    ]


def test_explicit_format_overrides_detection_and_is_checked(tmp_path):
    (tmp_path / "notes.txt").write_text("Just text.\n\nMore text.\n", encoding="utf-8")
    m = download_corpus(local(tmp_path / "notes.txt", fmt="wikitext"), tmp_path / "raw", progress=False)
    assert m["format"] == "wikitext" and m["total_rows"] == 3
    with pytest.raises(BertraceError, match=r"notes\.txt.*not WikiExtractor output"):
        download_corpus(local(tmp_path / "notes.txt", fmt="wikiextractor"), tmp_path / "raw", progress=False)


def test_multiple_parts_and_row_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "ROW_GROUP_ROWS", 3)
    monkeypatch.setattr(corpus, "PART_BYTES", 40)
    src = tmp_path / "docs.txt"
    docs = [f"document number {i} with some words" for i in range(10)]
    src.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    m = download_corpus(local(src), tmp_path / "raw", progress=False)
    assert len(m["parts"]) == 4  # 3+3+3+1 rows, each group of 3 exceeds 40 bytes
    assert [p["rows"] for p in m["parts"]] == [3, 3, 3, 1]
    assert [p["path"] for p in m["parts"]] == [f"part-{i:05d}.parquet" for i in range(4)]
    assert [t for t, _ in read_rows(tmp_path / "raw")] == docs


def test_rerun_replaces_previous_output_but_refuses_foreign_directories(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("one\n\ntwo\n", encoding="utf-8")
    out = tmp_path / "raw"
    download_corpus(local(src), out, progress=False)
    src.write_text("three\n", encoding="utf-8")
    assert download_corpus(local(src), out, progress=False)["total_rows"] == 1
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "part-00000.parquet"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind

    foreign = tmp_path / "mydocs"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious", encoding="utf-8")
    with pytest.raises(BertraceError, match=r"mydocs.*did not write.*thesis\.tex"):
        download_corpus(local(src), foreign, progress=False)
    assert (foreign / "thesis.tex").read_text() == "precious"


# -- local errors -------------------------------------------------------------------------------
def test_missing_path_error(tmp_path):
    with pytest.raises(BertraceError, match=r"nope.*not found.*download\.local\.path"):
        download_corpus(local(tmp_path / "nope"), tmp_path / "raw", progress=False)
    assert not (tmp_path / "raw").exists()


def test_directory_without_corpus_files(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "README.md").write_text("x", encoding="utf-8")
    with pytest.raises(BertraceError, match=r"no corpus files found.*README\.md"):
        download_corpus(local(tmp_path / "src"), tmp_path / "raw", progress=False)


def test_wrong_text_column_lists_present_columns(tmp_path):
    pq.write_table(pa.table({"review": ["a"], "label": [1]}), tmp_path / "d.parquet")
    with pytest.raises(BertraceError) as e:
        download_corpus(local(tmp_path / "d.parquet"), tmp_path / "raw", progress=False)
    msg = str(e.value)
    assert "d.parquet" in msg and "'text'" in msg and "['review', 'label']" in msg and "text_column" in msg

    (tmp_path / "d.jsonl").write_text('{"body": "a", "id": 3}\n', encoding="utf-8")
    with pytest.raises(BertraceError, match=r"d\.jsonl: record 1 has no 'text' field \(fields: \['body', 'id'\]\)"):
        download_corpus(local(tmp_path / "d.jsonl"), tmp_path / "raw", progress=False)


def test_non_text_column_and_bad_json(tmp_path):
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "n.parquet")
    with pytest.raises(BertraceError, match=r"n\.parquet: column 'text' has type int64"):
        download_corpus(local(tmp_path / "n.parquet"), tmp_path / "raw", progress=False)
    (tmp_path / "b.jsonl").write_text('{"text": "ok"}\n{"text": broken\n', encoding="utf-8")
    with pytest.raises(BertraceError, match=r"b\.jsonl: line 2 is not valid JSON"):
        download_corpus(local(tmp_path / "b.jsonl"), tmp_path / "raw", progress=False)


def test_undecodable_file_names_file_and_line(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("fine line\n\ncaf\xe9 in latin-1\n".encode("latin-1"))
    with pytest.raises(BertraceError, match=r"latin1\.txt: line 3 is not valid UTF-8.*iconv"):
        download_corpus(local(bad), tmp_path / "raw", progress=False)
    binary = tmp_path / "blob.txt"
    binary.write_bytes(b"\x00\x01\x02" * 10)
    with pytest.raises(BertraceError, match=r"blob\.txt: looks binary"):
        download_corpus(local(binary), tmp_path / "raw", progress=False)


def test_mixed_formats_error(tmp_path):
    (tmp_path / "wiki_00").write_text(WIKIEXTRACTOR, encoding="utf-8")
    (tmp_path / "notes.txt").write_text("plain doc\n", encoding="utf-8")
    with pytest.raises(BertraceError, match=r"mix formats.*documents: .*notes\.txt.*wikiextractor: .*wiki_00"):
        download_corpus(local(tmp_path), tmp_path / "raw", progress=False)


def test_bad_params(tmp_path):
    with pytest.raises(BertraceError, match=r"download\.source = 'ftp': input should be 'hub' or 'local'"):
        download_corpus({"source": "ftp"}, tmp_path / "raw", progress=False)
    with pytest.raises(BertraceError, match=r"download\.local\.format = 'xml': input should be 'auto', 'wikitext'"):
        download_corpus(local(tmp_path, fmt="xml"), tmp_path / "raw", progress=False)
    with pytest.raises(
        BertraceError, match=r"download\.local\.pth: unknown key; valid keys: format, path, text_column"
    ):
        download_corpus({"source": "local", "local": {"pth": "x"}}, tmp_path / "raw", progress=False)


# -- hub mirrors --------------------------------------------------------------------------------
def write_mirror_yaml(tmp_path: Path) -> Path:
    data = tmp_path / "copies"
    data.mkdir()
    (data / "wiki.test.raw").write_text(WIKITEXT, encoding="utf-8")
    (data / "wiki.train.raw").write_text(WIKITEXT.replace("Gamma", "Delta"), encoding="utf-8")
    index = tmp_path / "mirrors" / "hub.yaml"
    index.parent.mkdir()
    index.write_text(
        "# comment\n"
        "Salesforce/wikitext:\n"
        "  wikitext-2-raw-v1:\n"
        "    train: ../copies/wiki.train.raw\n"
        "    test: ../copies/wiki.test.raw\n"
        "stanfordnlp/imdb:\n"
        "  plain_text:\n"
        "    test: ../copies/wiki.test.raw\n",
        encoding="utf-8",
    )
    return index


def test_resolve_mirror_yaml_paths_relative_to_index(tmp_path, caplog):
    index = write_mirror_yaml(tmp_path)
    with caplog.at_level(logging.WARNING, logger="bertrace.corpus"):
        found = resolve_mirror(index, "Salesforce/wikitext", "wikitext-2-raw-v1", ["train", "validation", "test"])
    assert found == {"train": tmp_path / "copies" / "wiki.train.raw", "test": tmp_path / "copies" / "wiki.test.raw"}
    assert "['validation']" in caplog.text and "missing" in caplog.text


def test_resolve_mirror_yaml_errors(tmp_path):
    index = write_mirror_yaml(tmp_path)
    with pytest.raises(
        BertraceError, match=r"no entry for dataset 'glue' \(it has: \['Salesforce/wikitext', 'stanfordnlp/imdb'\]\)"
    ):
        resolve_mirror(index, "glue", "sst2", ["train"])
    with pytest.raises(BertraceError, match=r"has no config 'wikitext-103-raw-v1' \(it has: \['wikitext-2-raw-v1'\]\)"):
        resolve_mirror(index, "Salesforce/wikitext", "wikitext-103-raw-v1", ["train"])
    with pytest.raises(
        BertraceError, match=r"none of the requested splits \['validation'\].*it has: \['test', 'train'\]"
    ):
        resolve_mirror(index, "Salesforce/wikitext", "wikitext-2-raw-v1", ["validation"])
    with pytest.raises(BertraceError, match=r"not found"):
        resolve_mirror(tmp_path / "absent.yaml", "Salesforce/wikitext", "wikitext-2-raw-v1", ["test"])
    broken = tmp_path / "mirrors" / "broken.yaml"
    broken.write_text("Salesforce/wikitext:\n  wikitext-2-raw-v1:\n    test: ../copies/gone.raw\n", encoding="utf-8")
    with pytest.raises(
        BertraceError, match=r"broken\.yaml: Salesforce/wikitext/wikitext-2-raw-v1/test points at .*gone\.raw"
    ):
        resolve_mirror(broken, "Salesforce/wikitext", "wikitext-2-raw-v1", ["test"])


def test_resolve_mirror_directory_layout(tmp_path):
    folder = tmp_path / "hub" / "Salesforce" / "wikitext" / "wikitext-2-raw-v1"
    folder.mkdir(parents=True)
    for name in ("wiki.train.raw", "wiki.valid.raw", "test.parquet", ".wiki.test.raw.swp", "README.md"):
        (folder / name).write_text("x", encoding="utf-8")
    found = resolve_mirror(
        tmp_path / "hub", "Salesforce/wikitext", "wikitext-2-raw-v1", ["train", "validation", "test"]
    )
    assert {s: p.name for s, p in found.items()} == {
        "train": "wiki.train.raw",
        "validation": "wiki.valid.raw",
        "test": "test.parquet",
    }
    # a dataset without configs: <mirror>/<dataset>/<split>.<ext>
    (tmp_path / "hub" / "imdb").mkdir()
    (tmp_path / "hub" / "imdb" / "train.jsonl").write_text("{}", encoding="utf-8")
    assert resolve_mirror(tmp_path / "hub", "imdb", None, ["train"])["train"].name == "train.jsonl"

    (folder / "test.txt").write_text("x", encoding="utf-8")
    with pytest.raises(BertraceError, match=r"several files match split 'test'"):
        resolve_mirror(tmp_path / "hub", "Salesforce/wikitext", "wikitext-2-raw-v1", ["test"])
    with pytest.raises(BertraceError, match=r"no folder .*glue/sst2"):
        resolve_mirror(tmp_path / "hub", "glue", "sst2", ["train"])


def test_hub_source_through_mirror_records_missing_splits(tmp_path, caplog):
    index = write_mirror_yaml(tmp_path)
    with caplog.at_level(logging.WARNING, logger="bertrace.corpus"):
        m = download_corpus(hub(), tmp_path / "raw", mirror=str(index), progress=False)
    assert "validation" in caplog.text
    assert m["mirror"] == str(index)
    assert m["format"] == "wikitext"
    assert m["source"]["type"] == "hub" and m["source"]["dataset"] == "Salesforce/wikitext"
    assert m["source"]["splits"] == ["train", "validation", "test"]
    assert m["source"]["missing_splits"] == ["validation"]
    assert m["rows"] == {"train": 12, "test": 12} and m["total_rows"] == 24
    assert [(f["split"], f["sha256"]) for f in m["source"]["files"]] == [
        ("train", sha256_file(tmp_path / "copies" / "wiki.train.raw")),
        ("test", sha256_file(tmp_path / "copies" / "wiki.test.raw")),
    ]
    assert {s for _, s in read_rows(tmp_path / "raw")} == {"train", "test"}  # source = hub split name


def test_mirror_from_params_and_format_auto(tmp_path):
    index = write_mirror_yaml(tmp_path)
    params = hub(splits=["test"], fmt="auto")
    params["mirror"] = str(index)
    m = download_corpus(params, tmp_path / "raw", progress=False)
    assert m["format"] == "wikitext" and m["rows"] == {"test": 12}


def test_repository_mirror_serves_real_wikitext_test_split(tmp_path, monkeypatch):
    raw = shared_file("wikitext-2-raw", "wiki.test.raw")
    monkeypatch.chdir(REPO)  # the mirror and its relative paths are used from the repository root
    m = download_corpus(hub(), tmp_path / "raw", mirror="mirrors/shared-data.yaml", progress=False)
    assert m["source"]["missing_splits"] == ["train", "validation"]
    assert m["rows"] == {"test": 4358}  # = the Hugging Face test split's row count
    assert m["source"]["files"][0]["sha256"] == "173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08"
    assert Path(m["source"]["files"][0]["path"]).resolve() == raw.resolve()
    rows = [t for t, _ in read_rows(tmp_path / "raw")]
    assert rows[:2] == ["", " = Robert Boulter = "]


def test_hub_unreachable_error_explains_local_and_mirror_options(tmp_path):
    """Offline mode (as on a machine without internet): fails at once, no retry loop."""
    script = (
        "import sys; from pathlib import Path\n"
        "from pipeline.data.download import download_corpus\n"
        "from pipeline.core.errors import BertraceError\n"
        "p = {'source': 'hub', 'hub': {'dataset': 'Salesforce/wikitext', 'config': 'wikitext-2-raw-v1',"
        " 'revision': 'main', 'splits': ['test'], 'format': 'wikitext'}}\n"
        "try:\n"
        "    download_corpus(p, Path(sys.argv[1]), progress=False)\n"
        "except BertraceError as e:\n"
        "    print(e); sys.exit(2)\n"
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "PYTHONPATH": str(REPO),
    }
    r = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "raw")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    msg = r.stdout
    assert "cannot reach the Hugging Face hub for dataset 'Salesforce/wikitext'" in msg
    assert "download.source: local" in msg and "download.local.path" in msg
    assert "BERTRACE_HUB_MIRROR=" in msg and "download.mirror" in msg
    assert "wikitext-2-raw-v1:" in msg and "test: " in msg  # an example index entry
    assert not (tmp_path / "raw").exists()


def test_network_error_classification():
    from huggingface_hub.errors import OfflineModeIsEnabled

    assert is_network_error(ConnectionError("x"))
    assert is_network_error(OfflineModeIsEnabled("x"))
    assert is_network_error(TimeoutError())
    assert not is_network_error(ValueError("Unknown split"))


def test_hub_loading_path_with_a_local_dataset_folder(tmp_path):
    """The load_dataset branch (column check, split check, WikiText rows) on a folder dataset,
    in a subprocess with its own Hugging Face cache so nothing is written to the user's."""
    folder = tmp_path / "ds"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["", " = T = \n", "", " body . \n"], "n": [1, 2, 3, 4]}), folder / "test.parquet")
    script = (
        "import sys; from pipeline.data import download as corpus; from pipeline.core.errors import BertraceError\n"
        "ds = corpus._load_hub_split(sys.argv[1], None, 'main', 'test', 'text')\n"
        "print(list(corpus._hub_rows(ds, 'text', fmt='wikitext')))\n"
        "print(corpus._sniff_rows(corpus._hub_rows(ds, 'text', limit=10)))\n"
        "for split, column in (('test', 'content'), ('train', 'text')):\n"
        "    try:\n"
        "        corpus._load_hub_split(sys.argv[1], None, 'main', split, column)\n"
        "    except BertraceError as e:\n"
        "        print(e)\n"
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "PYTHONPATH": str(REPO),
    }
    r = subprocess.run(
        [sys.executable, "-c", script, str(folder)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "['', ' = T = ', '', ' body . ']"
    assert out[1] == "wikitext"
    assert "split test: no column 'content' (columns: ['text', 'n']); set download.hub.text_column" in out[2]
    assert 'Unknown split "train"' in out[3] and "fix download.hub.splits" in out[3]
