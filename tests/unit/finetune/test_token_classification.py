"""Token classification (NER): CoNLL reading, BIO checks, word-piece alignment, seqeval metrics,
training in every mode, prediction as spans, HF export, and an end-to-end `dvc repro` of
finetune -> evaluate on a small CoNLL file the test writes."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from pipeline.core.errors import BertraceError
from pipeline.core.formats import SPECIAL_TOKENS
from pipeline.core.io import sha256_file
from pipeline.data.tokenizer import build_tokenizer, load_tokenizer
from pipeline.finetune.encoding import collate_task_batch
from pipeline.finetune.loop import FinetuneConfig, build_model, finetune
from pipeline.finetune.results import checkpoint_metrics
from pipeline.finetune.task_data import load_task_data
from pipeline.finetune.token_data import (
    bio_violations,
    check_bio,
    encode_text,
    encode_words,
    entities,
    read_conll,
    spans,
)
from pipeline.models.checkpoint import load_pretrained, save_finetuned
from tests.support.finetuning import make_pretrain_checkpoint
from tests.support.task_repos import declared_evaluate_outputs, dvc_repro, tiny_repo

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
FILLER = "the a went to met saw with and yesterday today in from".split()
PEOPLE = [["alice"], ["bob"], ["carol", "smith"], ["dave", "jones"]]
PLACES = [["paris"], ["london"], ["new", "york"], ["rio", "de", "janeiro"]]


def synthetic_ner(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """Sentences of filler words with person and place names tagged in BIO (a learnable task)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words, tags = [], []
        for _ in range(rng.randint(2, 4)):
            words += rng.choices(FILLER, k=rng.randint(1, 3))
            tags += ["O"] * (len(words) - len(tags))
            kind, name = rng.choice([("PER", rng.choice(PEOPLE)), ("LOC", rng.choice(PLACES))])
            words += name
            tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(name) - 1)
        out.append((words, tags))
    return out


def write_conll(path: Path, sentences, crlf: bool = False, docstart: bool = True) -> Path:
    nl = "\r\n" if crlf else "\n"
    lines = ["-DOCSTART- -X- -X- O", ""] if docstart else []
    for words, tags in sentences:
        lines += [f"{w}\t{t}" for w, t in zip(words, tags)] + [""]
    path.write_bytes(nl.join(lines).encode("utf-8"))
    return path


def train_tokenizer(path: Path, vocab_size: int = 300) -> Path:
    from tokenizers import trainers

    tok = build_tokenizer(lowercase=True)
    corpus = [" ".join(w) for w, _ in synthetic_ner(300, 0)] + ["hello new york , said obama ."]
    tok.train_from_iterator(
        corpus,
        trainer=trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            continuing_subword_prefix="##",
            show_progress=False,
        ),
    )
    path.write_text(tok.to_str(), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


def task(d: Path, **over) -> dict:
    t = {
        "type": "token_classification",
        "source": "local",
        "local": {"train": str(d / "train.conll"), "validation": str(d / "dev.conll")},
        "text_columns": ["tokens"],
        "label_column": "ner_tags",
        "label_names": TAGS,
        "splits": {"train": "train", "validation": "validation", "test": None},
    }
    t.update(over)
    return t


# ---------------------------------------------------------------------------------------------
# CoNLL files and BIO
# ---------------------------------------------------------------------------------------------
def test_conll_reader_blank_lines_docstart_crlf_and_columns(tmp_path):
    text = (
        "-DOCSTART- -X- -X- O\r\n\r\n"
        "EU NNP B-NP B-ORG\r\nrejects VBZ B-VP O\r\n\t\r\n   \r\n"  # whitespace-only lines end a sentence too
        "Peter NNP B-NP B-PER\r\nBlackburn NNP I-NP I-PER\r\n\r\n"
        "-DOCSTART- -X- -X- O\r\n"
        "Gurez\tB-location,B-person\r\n"
    )  # no final blank line; WNUT-17 test style
    path = tmp_path / "x.conll"
    path.write_bytes(text.encode())
    stats = {}
    cols = read_conll(path, stats)
    assert cols == {
        "tokens": [["EU", "rejects"], ["Peter", "Blackburn"], ["Gurez"]],
        "ner_tags": [["B-ORG", "O"], ["B-PER", "I-PER"], ["B-location"]],
    }
    assert stats == {"sentences": 3, "tokens": 5, "multi_tags": 1}


def test_conll_line_without_tag_names_file_and_line(tmp_path):
    path = tmp_path / "bad.conll"
    path.write_text("a\tO\nlonely\n")
    with pytest.raises(BertraceError, match=r"bad\.conll:2: 'lonely' has no tag"):
        read_conll(path)


def test_bio_label_set_checked_and_violations_counted(tmp_path, tok_path):
    assert check_bio(TAGS, "x") == ["LOC", "PER"]
    with pytest.raises(BertraceError, match=r"params.yaml: finetune.task.label_names: .*BIO.*\['PER', 'LOC'\]"):
        check_bio(["O", "PER", "LOC"], "params.yaml: finetune.task.label_names")
    with pytest.raises(BertraceError, match=r"I-MISC.*no matching B- tag"):
        check_bio(["O", "B-PER", "I-PER", "I-MISC"], "x")
    assert bio_violations([["O", "I-PER", "I-PER", "B-LOC", "I-PER", "I-LOC"]]) == 3  # 2nd, 5th, 6th

    # the same checks through the loader: a non-BIO label set names the param, stray tags the file
    write_conll(tmp_path / "train.conll", [(["alice", "x"], ["B-PER", "O"]), (["paris"], ["I-LOC"])])
    write_conll(tmp_path / "dev.conll", [(["bob"], ["B-MISC"])])
    tok = load_tokenizer(tok_path)
    with pytest.raises(BertraceError, match="finetune.task.label_names.*BIO"):
        load_task_data(task(tmp_path, label_names=["negative", "positive"]), tok, max_len=32)
    with pytest.raises(BertraceError, match=r"dev\.conll: column 'ner_tags' has tags outside .*'B-MISC'"):
        load_task_data(task(tmp_path), tok, max_len=32)
    data = load_task_data(task(tmp_path), tok, max_len=32, roles=("train",))
    assert data.splits["train"].bio_violations == 1  # I-LOC at a sentence start


def test_entities_match_seqeval():
    from seqeval.metrics.sequence_labeling import get_entities

    rng = random.Random(0)
    for _ in range(300):
        seq = rng.choices(TAGS + ["B-ORG", "I-ORG"], k=rng.randint(1, 12))
        assert entities(seq) == get_entities(seq), seq


# ---------------------------------------------------------------------------------------------
# Alignment
# ---------------------------------------------------------------------------------------------
def test_first_subtoken_carries_the_label_the_rest_are_ignored(tok_path):
    tok = load_tokenizer(tok_path)
    words = [["londoner", "alice", "!"]]  # a word the vocabulary splits into several pieces
    pieces = [tok.encode(w, add_special_tokens=False).ids for w in words[0]]
    assert len(pieces[0]) > 1
    enc = encode_words(tok, words, [[3, 1, 0]], max_len=32)
    ids, labels, first = enc["input_ids"][0], enc["labels"][0], enc["first"][0]
    assert ids == [2, *pieces[0], *pieces[1], *pieces[2], 3]
    assert first == [1, 1 + len(pieces[0]), 1 + len(pieces[0]) + len(pieces[1])]
    expected = [-100] * len(ids)
    expected[first[0]], expected[first[1]], expected[first[2]] = 3, 1, 0
    assert labels == expected
    assert labels.count(-100) == len(ids) - 3  # [CLS], [SEP] and the continuation pieces
    # truncation: words past max_len have no position (predicted O) and the example is counted
    cut = encode_words(tok, words, [[3, 1, 0]], max_len=len(pieces[0]) + 2)
    assert cut["first"][0] == [1, -1, -1] and cut["truncated"] == 1
    assert len(cut["input_ids"][0]) == len(pieces[0]) + 2


def test_collate_pads_token_labels_with_ignore(tok_path, tmp_path):
    write_conll(tmp_path / "train.conll", synthetic_ner(6, 1))
    write_conll(tmp_path / "dev.conll", synthetic_ner(3, 2))
    data = load_task_data(task(tmp_path), load_tokenizer(tok_path), max_len=64)
    split = data.splits["train"]
    batch = collate_task_batch([split[i] for i in range(len(split))])
    assert batch["labels"].shape == batch["input_ids"].shape
    assert ((batch["attention_mask"] == 0) <= (batch["labels"] == -100)).all()  # padding is ignored
    n_words = sum(len(w) for w in split.words)
    assert int((batch["labels"] != -100).sum()) == n_words  # one labelled position per word


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------
def test_entity_level_f1_on_a_hand_made_example():
    from pipeline.finetune.task_metrics import entity_metrics

    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-LOC", "I-LOC", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-PER"], ["O", "B-LOC", "O", "O"]]  # 1 right, LOC typed wrong, LOC cut short
    m = entity_metrics(gold, pred)
    # entities: gold {PER 0-1, LOC 3, LOC 1-2}; predicted {PER 0-1, PER 3, LOC 1}: 1 TP of 3 and 3
    assert m["precision"] == pytest.approx(1 / 3) and m["recall"] == pytest.approx(1 / 3)
    assert m["f1"] == pytest.approx(1 / 3)
    assert m["per_type"]["PER"] == {"precision": 0.5, "recall": 1.0, "f1": pytest.approx(2 / 3), "support": 1}
    assert m["per_type"]["LOC"]["f1"] == 0.0 and m["per_type"]["LOC"]["support"] == 2
    assert m["accuracy"] == pytest.approx(6 / 8) and m["entities"] == 3 and m["words"] == 8
    assert m["predicted_entities"] == 3


# ---------------------------------------------------------------------------------------------
# Training, prediction, export
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory, tok_path):
    """A token classifier fine-tuned (full) on synthetic NER, saved as model.pt + tokenizer.json."""
    d = tmp_path_factory.mktemp("ner")
    write_conll(d / "train.conll", synthetic_ner(240, 1), crlf=True)
    write_conll(d / "dev.conll", synthetic_ner(60, 2))
    ckpt_path = make_pretrain_checkpoint(d / "pre.pt", tok_path)
    ckpt = load_pretrained(ckpt_path)
    cfg = FinetuneConfig.from_params(
        {"task": task(d), "epochs": 4, "seeds": [0], "batch_size": 16, "lr": 2e-3, "warmup": 0.0, "max_len": 48}
    )
    data = load_task_data(cfg.task, load_tokenizer(tok_path), max_len=48)
    summary, best = finetune(ckpt, data, cfg, progress=False)
    out = d / "ft"
    save_finetuned(
        out / "model.pt",
        state_dict=best.state_dict,
        model_config=ckpt["model_config"],
        label_names=data.label_names,
        task=data.task_info(),
        tokenizer_sha256=sha256_file(tok_path),
        mode="full",
        seed=0,
        metrics=checkpoint_metrics(summary, best, [0]),
        provenance={},
        num_labels=data.num_labels,
    )
    shutil.copyfile(tok_path, out / "tokenizer.json")
    return {
        "dir": d,
        "ckpt": ckpt,
        "data": data,
        "summary": summary,
        "best": best,
        "model": out / "model.pt",
        "cfg": cfg,
    }


def test_full_finetuning_learns_the_entities(trained):
    s = trained["summary"]
    assert s["task_type"] == "token_classification"
    assert s["validation_f1"]["mean"] > 0.8, s  # names from a closed list: a tiny model finds them
    assert set(s["per_seed"]["0"]) >= {
        "validation_f1",
        "validation_precision",
        "validation_recall",
        "validation_accuracy",
        "validation_loss",
    }
    assert s["best_validation_f1"] == trained["best"].score


@pytest.mark.parametrize("mode", ["frozen", "scratch"])
def test_frozen_and_scratch_modes_train(trained, mode):
    cfg = FinetuneConfig.from_params({**trained["cfg"].model_dump(), "mode": mode, "epochs": 1})
    summary, best = finetune(trained["ckpt"], trained["data"], cfg, progress=False)
    assert 0.0 <= summary["validation_f1"]["mean"] <= 1.0 and best.state_dict is not None
    model = build_model(trained["ckpt"], len(TAGS), mode, task_type="token_classification")
    assert type(model).__name__ == "BertForTokenClassification"
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert (len(frozen) > 0) == (mode == "frozen") and all(n.startswith("bert.") for n in frozen)


def test_predict_prints_spans_with_character_offsets(trained, capsys):
    from pipeline.evaluate.inference import Classifier
    from stages.cli.predict import main_predict

    text = "yesterday  Carol Smith went to New York."
    clf = Classifier.load(trained["model"])
    [out] = clf.predict([text])
    assert out["tags"] == ["O", "B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "O"]
    assert out["entities"] == [
        {"type": "PER", "text": "Carol Smith", "start": 11, "end": 22},
        {"type": "LOC", "text": "New York", "start": 31, "end": 39},
    ]
    main_predict([text, "met bob in paris", "--model", str(trained["model"])])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines[0] == {"text": text, "entities": out["entities"]}
    assert [e["text"] for e in lines[1]["entities"]] == ["bob", "paris"]


def test_spans_and_text_offsets(tok_path):
    tok = load_tokenizer(tok_path)
    text = "Hello New  York!"
    enc = encode_text(tok, text, max_len=32)
    assert [text[s:e] for s, e in enc["offsets"]] == ["Hello", "New", "York", "!"]
    assert spans(text, ["O", "B-LOC", "I-LOC", "O"], enc["offsets"]) == [
        {"type": "LOC", "text": "New  York", "start": 6, "end": 15}
    ]


def test_pyfunc_frame_gives_entities(trained):
    import pandas as pd

    from pipeline.evaluate.inference import Classifier
    from pipeline.interop.pyfunc import predict_frame

    frame = predict_frame(Classifier.load(trained["model"]), pd.DataFrame({"tokens": ["met bob in paris", "the"]}))
    assert list(frame.columns) == ["entities"]
    assert [e["type"] for e in json.loads(frame["entities"][0])] == ["PER", "LOC"]


def test_hf_export_token_classification_round_trip(trained, tmp_path):
    transformers = pytest.importorskip("transformers")
    from pipeline.evaluate.inference import Classifier
    from pipeline.interop.export import export_hf

    info = export_hf(trained["model"], tmp_path / "hf")
    assert info["architecture"] == "BertForTokenClassification"
    assert info["verification"]["max_abs_logit_diff"] < 1e-5
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["id2label"] == {str(i): n for i, n in enumerate(TAGS)}
    hf = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "BertForTokenClassification"
    clf = Classifier.load(trained["model"])
    enc = encode_text(clf.tokenizer, "met bob in new york", 32)
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        ours = clf.model(ids, torch.zeros_like(ids), torch.ones_like(ids))
        theirs = hf(input_ids=ids, token_type_ids=torch.zeros_like(ids), attention_mask=torch.ones_like(ids)).logits
    assert (ours - theirs).abs().max().item() < 1e-5


# ---------------------------------------------------------------------------------------------
# End to end: dvc repro finetune -> evaluate
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_dvc_repro_token_classification_end_to_end(tmp_path):
    crlf = lambda s: write_conll(tmp_path / "x", s, crlf=True).read_bytes()  # noqa: E731
    files = {
        "ner-train.conll": crlf(synthetic_ner(160, 1)),
        "ner-dev.conll": crlf(synthetic_ner(40, 2)),
        "ner-test.txt": crlf(synthetic_ner(40, 3)),
    }  # a .txt file read as CoNLL through format: conll
    t = {
        "type": "token_classification",
        "source": "local",
        "format": "conll",
        "local": {
            "train": "data/sources/ner-train.conll",
            "validation": "data/sources/ner-dev.conll",
            "test": "data/sources/ner-test.txt",
        },
        "text_columns": ["tokens"],
        "label_column": "ner_tags",
        "label_names": TAGS,
    }
    root, env = tiny_repo(tmp_path / "repo", t, files)
    out = dvc_repro(root, env)
    assert "Running stage 'finetune'" in out and "Running stage 'evaluate'" in out
    for path in declared_evaluate_outputs(root):
        assert (root / path).exists(), path
    details = json.loads((root / "reports/finetune.json").read_text())
    assert details["task_type"] == "token_classification" and 0 <= details["validation_f1"]["mean"] <= 1
    metrics = json.loads((root / "metrics/eval.json").read_text())
    assert set(metrics) == {"dev_f1", "test_f1"}
    evaluation = json.loads((root / "reports/evaluate.json").read_text())
    assert set(evaluation["test"]["per_type"]) == {"PER", "LOC"}
    assert evaluation["validation"]["f1"] == pytest.approx(details["best_validation_f1"], abs=1e-6)
    report = (root / "reports/evaluation.md").read_text()
    assert "token classification (NER)" in report and "per entity type" in report and "| LOC |" in report
    confusion = (root / "plots/confusion.csv").read_text().splitlines()
    assert confusion[0] == "actual,predicted" and len(confusion) - 1 == sum(len(w) for w, _ in synthetic_ner(40, 2))
    assert (root / "plots/scatter.csv").read_text() == "predicted,gold\n"  # no scatter for NER
    ckpt = torch.load(root / "data/finetune/model.pt", weights_only=True)
    assert ckpt["task"]["type"] == "token_classification" and ckpt["label_names"] == TAGS
