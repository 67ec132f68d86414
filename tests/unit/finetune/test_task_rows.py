"""Rows of task files: empty text skipped and counted, missing labels named by row, label names
compared in Unicode NFC; the finetune stage's warning when max_len exceeds pre-training's max_seq_len."""

from __future__ import annotations

import json
import unicodedata

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from pipeline.core.errors import BertraceError
from pipeline.finetune.task_data import load_task_data
from tests.support.finetuning import synthetic_rows, write_csv

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread

ROWS = "(1-based, a header line not counted)"
NFD = unicodedata.normalize("NFD", "négatif")  # e + U+0301
NFC = unicodedata.normalize("NFC", "négatif")
TAGS = ["O", "B-PER", "I-PER"]


def local(train, validation=None, **over) -> dict:
    return {
        "source": "local",
        "local": {"train": str(train), "validation": str(validation or train)},
        "text_columns": ["text"],
        "label_names": ["neg", "pos"],
        **over,
    }


def write_jsonl(path, rows: list[dict]):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# Empty text
# ---------------------------------------------------------------------------------------------
def test_empty_text_rows_are_skipped_counted_and_warned_once_per_file(env, tmp_path, capsys):
    rows = [("good film", "pos"), ("", "neg"), ("bad film", "neg"), ("   ", "pos"), ("a good one", "pos")]
    train = write_csv(tmp_path / "train.csv", ["text", "label"], rows)
    dev = write_csv(tmp_path / "dev.csv", ["text", "label"], [("good", "pos"), ("bad", "neg")])
    data = load_task_data(local(train, dev), env["tokenizer"], max_len=32)
    tr = data.splits["train"]
    assert (len(tr), tr.skipped, data.splits["validation"].skipped) == (3, 2, 0)
    assert tr.labels.tolist() == [1, 0, 1]
    assert [2, 3] not in tr.input_ids  # no [CLS] [SEP] example
    assert capsys.readouterr().err == (
        f"warning: {train}: skipping 2 of 5 data rows with empty text in 'text' (neither trained on nor scored): "
        f"data rows 2, 4 {ROWS}; fill in the text or delete those rows\n"
    )
    # the same file for train and validation: one warning; a custom warn gets the line
    lines = []
    both = load_task_data(local(train), env["tokenizer"], max_len=32, warn=lines.append)
    assert len(lines) == 1 and both.splits["validation"].skipped == 2 and not capsys.readouterr().err


def test_empty_text_in_jsonl_parquet_and_pairs(env, tmp_path):
    many = [{"text": None if i % 3 == 0 else f"good film {i}", "label": i % 2} for i in range(20)]
    jsonl = write_jsonl(tmp_path / "t.jsonl", many)
    lines = []
    data = load_task_data(local(jsonl), env["tokenizer"], max_len=32, warn=lines.append)
    assert len(data.splits["train"]) == 13 and data.splits["train"].skipped == 7
    assert lines == [
        f"{jsonl}: skipping 7 of 20 data rows with empty text in 'text' (neither trained on nor scored): "
        f"data rows 1, 4, 7, 10, 13 and 2 more {ROWS}; fill in the text or delete those rows"
    ]
    parquet = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["good", None, " \t", "bad"], "label": [1, 0, 1, 0]}), parquet)
    data = load_task_data(local(parquet), env["tokenizer"], max_len=32, warn=lambda m: None)
    assert data.splits["train"].labels.tolist() == [1, 0] and data.splits["train"].skipped == 2
    # a sentence pair: either text empty
    pairs = write_jsonl(
        tmp_path / "p.jsonl",
        [{"a": "good", "b": "film", "label": 0}, {"a": "good", "b": "", "label": 1}, {"a": "", "b": "x", "label": 1}],
    )
    lines.clear()
    data = load_task_data(
        local(pairs, text_columns=["a", "b"]), env["tokenizer"], max_len=32, warn=lines.append, roles=("train",)
    )
    assert len(data.splits["train"]) == 1 and data.splits["train"].skipped == 2
    assert lines[0].startswith(f"{pairs}: skipping 2 of 3 data rows with empty text in 'a' or 'b' ")
    # every row empty: an error, not an empty split
    blank = write_csv(tmp_path / "blank.csv", ["text", "label"], [("", "pos"), (" ", "neg")])
    with pytest.raises(BertraceError) as e:
        load_task_data(local(blank), env["tokenizer"], max_len=32)
    assert str(e.value) == (
        f"{blank}: all 2 data rows have empty text in 'text'; fix the file or point finetune.task.splits.train "
        "at another split"
    )


def test_carved_validation_counts_its_own_skipped_rows(env, tmp_path):
    rows = [(t if i % 10 else "", y) for i, (t, y) in enumerate(synthetic_rows(100, 1))]
    path = write_csv(tmp_path / "all.csv", ["text", "label"], rows)
    task = local(path, splits={"train": "train", "validation": None, "test": None}, local={"train": str(path)})
    data = load_task_data(task, env["tokenizer"], max_len=32, warn=lambda m: None)
    tr, va = data.splits["train"], data.splits["validation"]
    assert tr.skipped + va.skipped == 10 and len(tr) + len(va) == 90
    assert len(va) + va.skipped == 10  # the carve is over every row of the file, as before


def test_token_classification_rows_without_words_are_skipped(env, tmp_path):
    path = tmp_path / "ner.parquet"
    tokens = [["alice", "went"], [], ["bob"], None]
    tags = [["B-PER", "O"], [], ["B-PER"], None]
    pq.write_table(pa.table({"tokens": tokens, "ner_tags": tags}), path)
    task = local(path, type="token_classification", text_columns=["tokens"], label_column="ner_tags", label_names=TAGS)
    lines = []
    data = load_task_data(task, env["tokenizer"], max_len=32, warn=lines.append, roles=("train",))
    assert data.splits["train"].words == [["alice", "went"], ["bob"]] and data.splits["train"].skipped == 2
    assert lines == [
        f"{path}: skipping 2 of 4 data rows with no words in 'tokens' (neither trained on nor scored): "
        f"data rows 2, 4 {ROWS}; fill in the words or delete those rows"
    ]


# ---------------------------------------------------------------------------------------------
# Missing labels
# ---------------------------------------------------------------------------------------------
def test_missing_label_names_the_rows_and_the_fix(env, tmp_path):
    path = write_csv(
        tmp_path / "gaps.csv", ["text", "label"], [("good", "pos"), ("bad", ""), ("ok", " "), ("x", "neg")]
    )
    with pytest.raises(BertraceError) as e:
        load_task_data(local(path), env["tokenizer"], max_len=32)
    assert str(e.value) == (
        f"{path}: column 'label' has no label in 2 of 4 data rows with text: data rows 2, 3 {ROWS}; fill in "
        "the label or delete those rows"
    )
    jsonl = write_jsonl(tmp_path / "gaps.jsonl", [{"text": "good", "label": 1}, {"text": "bad", "label": None}])
    with pytest.raises(BertraceError, match=r"has no label in 1 of 2 data rows with text: data row 2 \(1-based"):
        load_task_data(local(jsonl), env["tokenizer"], max_len=32)
    # all missing: still an unlabelled test split
    test = write_csv(tmp_path / "test.csv", ["text", "label"], [("good", ""), ("bad", "")])
    task = {**local(path), "local": {"test": str(test)}, "splits": {"test": "test"}}
    assert load_task_data(task, env["tokenizer"], max_len=32, roles=("test",)).splits["test"].labels is None


def test_empty_text_and_missing_label_in_one_file_are_both_reported(env, tmp_path, capsys):
    """The empty-text row is skipped (warned) before labels are checked; the error names the
    missing label's row only, and a row with neither text nor label is a skipped row."""
    rows = [("good", "pos"), ("", "neg"), ("bad", ""), ("", ""), ("ok", "neg")]
    path = write_csv(tmp_path / "both.csv", ["text", "label"], rows)
    with pytest.raises(BertraceError) as e:
        load_task_data(local(path), env["tokenizer"], max_len=32)
    assert capsys.readouterr().err == (
        f"warning: {path}: skipping 2 of 5 data rows with empty text in 'text' (neither trained on nor scored): "
        f"data rows 2, 4 {ROWS}; fill in the text or delete those rows\n"
    )
    assert str(e.value) == (
        f"{path}: column 'label' has no label in 1 of 3 data rows with text: data row 3 {ROWS}; fill in the "
        "label or delete those rows"
    )


def test_missing_score_and_missing_tags_name_their_rows(env, tmp_path):
    sts = write_jsonl(
        tmp_path / "sts.jsonl",
        [{"a": "x", "b": "y", "score": 1.5}, {"a": "x", "b": "z", "score": None}, {"a": "", "b": "z", "score": None}],
    )
    task = local(sts, type="regression", text_columns=["a", "b"], label_column="score", label_names=[])
    with pytest.raises(BertraceError) as e:
        load_task_data(task, env["tokenizer"], max_len=32, warn=lambda m: None)
    assert str(e.value) == (
        f"{sts}: column 'score' has no score in 1 of 2 data rows with text: data row 2 {ROWS}; fill in the "
        "score or delete those rows"
    )
    ner = write_jsonl(
        tmp_path / "ner.jsonl",
        [{"tokens": ["alice"], "ner_tags": ["B-PER"]}, {"tokens": ["bob", "ran"], "ner_tags": []}],
    )
    task = local(ner, type="token_classification", text_columns=["tokens"], label_column="ner_tags", label_names=TAGS)
    with pytest.raises(BertraceError) as e:
        load_task_data(task, env["tokenizer"], max_len=32)
    assert str(e.value) == (
        f"{ner}: column 'ner_tags' has no tags in 1 of 2 data rows with text: data row 2 {ROWS}; fill in the "
        "tags or delete those rows"
    )


# ---------------------------------------------------------------------------------------------
# Unicode
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("in_file, in_params", [(NFD, NFC), (NFC, NFD)], ids=["decomposed-file", "decomposed-params"])
def test_label_names_are_compared_in_nfc(env, tmp_path, in_file, in_params):
    assert in_file != in_params
    path = write_csv(tmp_path / "fr.csv", ["text", "label"], [("bad", in_file), ("good", "positif"), ("x", in_file)])
    data = load_task_data(local(path, label_names=[in_params, "positif"]), env["tokenizer"], max_len=32)
    assert data.splits["train"].labels.tolist() == [0, 1, 0] and data.label_names == [NFC, "positif"]
    # token classification tags likewise
    ner = write_jsonl(tmp_path / "ner.jsonl", [{"tokens": ["zoé", "ran"], "ner_tags": [f"B-{in_file}", "O"]}])
    names = ["O", f"B-{in_params}", f"I-{in_params}"]
    task = local(ner, type="token_classification", text_columns=["tokens"], label_column="ner_tags", label_names=names)
    data = load_task_data(task, env["tokenizer"], max_len=32, roles=("train",))
    assert data.splits["train"].word_labels == [[1, 0]] and data.label_names[1] == f"B-{NFC}"


def test_label_names_equal_after_nfc_are_listed_twice(env, tmp_path):
    path = write_csv(tmp_path / "fr.csv", ["text", "label"], [("bad", NFC)])
    with pytest.raises(BertraceError) as e:
        load_task_data(local(path, label_names=[NFC, NFD]), env["tokenizer"], max_len=32)
    assert str(e.value) == (
        f"params.yaml: finetune.task.label_names lists {NFC!r} more than once (names are compared in Unicode "
        "NFC); list each label once"
    )


# ---------------------------------------------------------------------------------------------
# The stage: max_len beyond pre-training's max_seq_len, skipped rows in the report
# ---------------------------------------------------------------------------------------------
def _stage_repo(env, root, task: dict, max_len: int, examples: dict | None) -> None:
    (root / "data" / "tokenizer").mkdir(parents=True)
    (root / "data" / "pretrain").mkdir(parents=True)
    (root / "data" / "tokenizer" / "tokenizer.json").write_bytes(env["tokenizer_path"].read_bytes())
    ckpt = torch.load(env["ckpt_path"], weights_only=True)
    if examples is not None:  # the examples record a pre-training run embeds (stages/pretrain.py add_upstream)
        ckpt["provenance"] = {**ckpt["provenance"], "upstream": {"examples": {"stage": "examples", "params": examples}}}
    torch.save(ckpt, root / "data" / "pretrain" / "best.pt")
    params = {
        "compute": {"kernels": "portable"},
        "finetune": {
            "checkpoint": "data/pretrain/best.pt",
            "tokenizer": "data/tokenizer/tokenizer.json",
            "task": task,
            "max_len": max_len,
            "epochs": 1,
            "batch_size": 32,
            "seeds": [1],
            "threads": 1,
        },
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")


def test_stage_warns_when_max_len_exceeds_pretraining_max_seq_len(env, tmp_path, monkeypatch, capsys):
    import stages.finetune as stage

    monkeypatch.setenv("BERTRACE_NO_MLFLOW", "1")
    monkeypatch.delenv("BERTRACE_HUB_MIRROR", raising=False)
    root = tmp_path / "repo"
    rows = synthetic_rows(60, 1)
    rows[4] = ("", rows[4][1])
    train = write_csv(tmp_path / "train.csv", ["text", "label"], rows)
    _stage_repo(env, root, local(train, env["task"]["local"]["validation"]), 32, {"max_seq_len": 16, "mode": "mlm_nsp"})
    monkeypatch.chdir(root)
    stage.main(progress=False)
    expected = [
        "params.yaml: finetune.max_len 32 exceeds the pre-training examples' max_seq_len 16 (data/pretrain/best.pt): "
        "positions 16..31 were never trained; lower finetune.max_len to 16 (truncation: head_tail keeps a long "
        "text's start and end), or pre-train with examples.max_seq_len >= 32",
        f"{train}: skipping 1 of 60 data rows with empty text in 'text' (neither trained on nor scored): "
        f"data row 5 {ROWS}; fill in the text or delete those rows",
    ]
    err = [line for line in capsys.readouterr().err.splitlines() if ": warning: " in line]
    assert err == [f"finetune: warning: {line}" for line in expected]
    saved = json.loads((root / "reports" / "finetune.json").read_text())
    assert saved["warnings"] == expected and saved["pretrain_max_seq_len"] == 16
    assert saved["skipped_rows"] == {"train": 1, "validation": 0} and saved["examples"]["train"] == 59


def test_stage_is_quiet_within_max_seq_len_or_without_a_record(env, tmp_path, monkeypatch, capsys):
    import stages.finetune as stage

    monkeypatch.setenv("BERTRACE_NO_MLFLOW", "1")
    monkeypatch.delenv("BERTRACE_HUB_MIRROR", raising=False)
    for name, examples, recorded in (("within", {"max_seq_len": 32}, 32), ("none", None, None)):
        root = tmp_path / name
        _stage_repo(env, root, env["task"], 32, examples)
        monkeypatch.chdir(root)
        stage.main(progress=False)
        assert ": warning: " not in capsys.readouterr().err
        saved = json.loads((root / "reports" / "finetune.json").read_text())
        assert saved["warnings"] == [] and saved["pretrain_max_seq_len"] == recorded
        assert saved["skipped_rows"] == {"train": 0, "validation": 0}
