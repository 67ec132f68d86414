"""Inference, Hugging Face export, the MLflow pyfunc model and the predict / export CLI.

Checkpoints are built here (tiny random models, tiny tokenizer: helpers in tests/unit/evaluate/test_evaluate.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.evaluate.inference import Classifier
from tests.support.chain import make_finetuned, sentences, tiny_config, train_tiny_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = [
    "A gripping, FUNNY film!",
    "the plot was dull ... and the actor bad",
    "Café résumé naïve ☃ 𝄞",
    "",
    "good " * 40,
]  # accents, unknown characters, empty, one that needs truncation


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("finetuned")
    make_finetuned(d, label_names=("neg", "neu", "pos"), seed=3)
    return d


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory, ckpt_dir) -> Path:
    d = tmp_path_factory.mktemp("pair")
    make_finetuned(
        d,
        text_columns=("premise", "hypothesis"),
        label_names=("entailment", "not_entailment"),
        seed=4,
        tokenizer=ckpt_dir / "tokenizer.json",
    )
    return d


def _hf_logits(model, ids, types) -> np.ndarray:
    from pipeline.finetune.encoding import collate_task_batch

    batch = collate_task_batch([(i, t, 0) for i, t in zip(ids, types)])
    with torch.no_grad():
        return model(
            input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"]
        ).logits.numpy()


# --------------------------------------------------------------------------------------------
# Inference


def test_predict_is_batched_consistently_and_well_formed(ckpt_dir):
    clf = Classifier.load(ckpt_dir / "model.pt")
    assert not clf.model.training and clf.label_names == ["neg", "neu", "pos"]
    texts = TEXTS + sentences(40, 5)
    out = clf.predict(texts, batch_size=64)
    one_by_one = np.concatenate([clf.logits([t], batch_size=1) for t in texts])
    np.testing.assert_allclose(clf.logits(texts, batch_size=7), one_by_one, atol=1e-5)  # padding is masked
    assert len(out) == len(texts)
    for o, row in zip(out, one_by_one):
        assert set(o["probabilities"]) == {"neg", "neu", "pos"}
        assert sum(o["probabilities"].values()) == pytest.approx(1.0, abs=1e-9)
        assert o["label_id"] == int(row.argmax()) and o["label"] == clf.label_names[o["label_id"]]
        assert o["probabilities"][o["label"]] == max(o["probabilities"].values())
    assert len({o["label"] for o in out}) > 1  # the tiny model is not constant
    assert clf.predict("a good film") == clf.predict(["a good film"])
    ids, _ = clf.encode(["good " * 40])
    assert len(ids[0]) == 32 and ids[0][0] == 2 and ids[0][-1] == 3  # cut to the checkpoint's max_len


def test_tokenizer_hash_mismatch_names_both_hashes(ckpt_dir, tmp_path):
    bad = tmp_path / "m"
    bad.mkdir()
    (bad / "model.pt").write_bytes((ckpt_dir / "model.pt").read_bytes())
    train_tiny_tokenizer(bad / "tokenizer.json", vocab_size=250)  # a different tokenizer
    expected, actual = sha256_file(ckpt_dir / "tokenizer.json"), sha256_file(bad / "tokenizer.json")
    with pytest.raises(BertraceError) as e:
        Classifier.load(bad / "model.pt")
    assert expected in str(e.value) and actual in str(e.value) and "tokenizer.json" in str(e.value)
    (bad / "tokenizer.json").unlink()
    with pytest.raises(BertraceError, match="tokenizer not found"):
        Classifier.load(bad / "model.pt")


def test_wrong_kind_of_checkpoint_is_a_clear_error(tmp_path, ckpt_dir):
    from pipeline.models.bert import BertForPreTraining
    from pipeline.models.checkpoint import save_checkpoint

    config = tiny_config(100)
    pre = save_checkpoint(
        tmp_path / "best.pt",
        {
            "model": BertForPreTraining(config).state_dict(),
            "model_config": config.to_dict(),
            "step": 3,
            "provenance": {},
        },
    )
    with pytest.raises(BertraceError, match="pre-training checkpoint"):
        Classifier.load(pre)
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(BertraceError, match="not a readable checkpoint"):
        Classifier.load(tmp_path / "junk.pt")
    with pytest.raises(BertraceError, match="checkpoint not found"):
        Classifier.load(tmp_path / "missing.pt")


def test_pair_model_takes_pairs(pair_dir):
    clf = Classifier.load(pair_dir / "model.pt")
    out = clf.predict([("the film was good", "it was great"), ("bad", "dull plot")])
    assert [set(o["probabilities"]) for o in out] == [{"entailment", "not_entailment"}] * 2
    ids, types = clf.encode([("a b", "c")])
    assert types[0][0] == 0 and types[0][-1] == 1
    with pytest.raises(BertraceError, match="sentence pairs"):
        clf.predict(["just one text"])

    import pandas as pd

    from pipeline.interop.pyfunc import predict_frame

    frame = pd.DataFrame({"hypothesis": ["it was great", "dull plot"], "premise": ["the film was good", "bad"]})
    out = predict_frame(clf, frame)
    assert out["label"].tolist() == [o["label"] for o in out_pairs(clf)]
    with pytest.raises(BertraceError, match=r"no column\(s\) \['premise'\]"):
        predict_frame(clf, frame.drop(columns=["premise"]))


def out_pairs(clf):
    return clf.predict([("the film was good", "it was great"), ("bad", "dull plot")])


# --------------------------------------------------------------------------------------------
# Hugging Face export


def test_hf_export_classifier_matches_our_logits_and_tokens(ckpt_dir, tmp_path):
    from pipeline.interop.export import export_hf

    out = tmp_path / "hf"
    info = export_hf(ckpt_dir / "model.pt", out)
    assert {
        "config.json",
        "vocab.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "bertrace_export.json",
    } <= set(info["files"])
    assert {"model.safetensors", "pytorch_model.bin"} & set(info["files"])
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is True
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "neu", "2": "pos"} and config["label2id"]["pos"] == 2

    clf = Classifier.load(ckpt_dir / "model.pt")
    hf_model = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    hf_tok = transformers.BertTokenizerFast.from_pretrained(out)
    assert hf_model.config.id2label == {0: "neg", 1: "neu", 2: "pos"}
    texts = TEXTS + sentences(20, 6)
    ids, types = clf.encode(texts)
    np.testing.assert_allclose(_hf_logits(hf_model, ids, types), clf.logits(texts), atol=1e-5, rtol=0)

    # the HF tokenizer encodes like ours: single texts, pairs, and head truncation to max_len
    for text in texts:
        assert hf_tok(text)["input_ids"] == clf.tokenizer.encode(text).ids
    enc = hf_tok("the film", "was great")
    ours = clf.tokenizer.encode("the film", "was great")
    assert enc["input_ids"] == ours.ids and enc["token_type_ids"] == ours.type_ids
    assert hf_tok(texts[4], truncation=True)["input_ids"] == ids[4]  # model_max_length = max_len 32
    assert [l.rstrip("\n") for l in open(out / "vocab.txt", encoding="utf-8")][:5] == [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
    ]
    export_info = json.loads((out / "bertrace_export.json").read_text())
    assert export_info["source_sha256"] == sha256_file(ckpt_dir / "model.pt")
    assert export_info["verification"]["max_abs_logit_diff"] <= 1e-5

    # exporting again replaces a previous export; a foreign directory is left alone
    export_hf(ckpt_dir / "model.pt", out, verify=False)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(BertraceError, match="not a bertrace export"):
        export_hf(ckpt_dir / "model.pt", foreign)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_hf_export_pretraining_checkpoint(ckpt_dir, tmp_path):
    from tokenizers import Tokenizer

    from pipeline.finetune.encoding import collate_task_batch, encode_examples
    from pipeline.interop.export import export_hf
    from pipeline.models.bert import BertForPreTraining
    from pipeline.models.checkpoint import save_checkpoint

    # the pipeline's layout: data/pretrain/best.pt, data/tokenizer/tokenizer.json
    data = tmp_path / "data"
    (data / "tokenizer").mkdir(parents=True)
    tok_path = data / "tokenizer" / "tokenizer.json"
    tok_path.write_bytes((ckpt_dir / "tokenizer.json").read_bytes())
    tok = Tokenizer.from_file(str(tok_path))
    torch.manual_seed(11)
    config = tiny_config(tok.get_vocab_size())
    model = BertForPreTraining(config).eval()
    save_checkpoint(
        data / "pretrain" / "best.pt",
        {
            "model": model.state_dict(),
            "model_config": config.to_dict(),
            "step": 10,
            "provenance": {"tokenizer_sha256": sha256_file(tok_path), "examples_manifest_sha256": "0" * 64},
        },
    )

    out = tmp_path / "hf-pre"
    info = export_hf(data / "pretrain" / "best.pt", out)  # tokenizer found in data/tokenizer/
    assert info["architecture"] == "BertForPreTraining"
    hf = transformers.BertForPreTraining.from_pretrained(out).eval()
    a, b = sentences(6, 7), sentences(6, 8)
    ids, types, _ = encode_examples(tok, a, b, 64)
    batch = collate_task_batch([(i, t, 0) for i, t in zip(ids, types)])
    with torch.no_grad():
        ours = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        theirs = hf(
            input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"]
        )
    valid = batch["attention_mask"].bool()
    torch.testing.assert_close(theirs.prediction_logits[valid], ours.mlm_logits[valid], atol=1e-5, rtol=0)
    torch.testing.assert_close(theirs.seq_relationship_logits, ours.nsp_logits, atol=1e-5, rtol=0)
    hf_tok = transformers.BertTokenizerFast.from_pretrained(out)
    assert hf_tok(a[0], b[0])["input_ids"] == tok.encode(a[0], b[0]).ids

    # a tokenizer other than the one pre-training used is refused, naming both hashes
    other = train_tiny_tokenizer(tmp_path / "other" / "tokenizer.json", vocab_size=250)
    with pytest.raises(BertraceError) as e:
        export_hf(data / "pretrain" / "best.pt", tmp_path / "hf-other", tokenizer_path=other)
    assert sha256_file(other) in str(e.value) and sha256_file(tok_path) in str(e.value)
    assert not (tmp_path / "hf-other").exists()


def test_a_pre_ln_checkpoint_is_refused_naming_the_param(ckpt_dir, tmp_path):
    """transformers' BERT and ELECTRA are post-LN: a pre-LN encoder (pretrain.model.pre_ln) has no
    exact export, so none is written."""
    import dataclasses

    from tokenizers import Tokenizer

    from pipeline.interop.export import export_hf
    from pipeline.models.bert import BertForPreTraining
    from pipeline.models.checkpoint import save_checkpoint

    tok_path = ckpt_dir / "tokenizer.json"
    config = dataclasses.replace(tiny_config(Tokenizer.from_file(str(tok_path)).get_vocab_size()), pre_ln=True)
    model = BertForPreTraining(config)
    save_checkpoint(
        tmp_path / "best.pt",
        {
            "model": model.state_dict(),
            "model_config": config.to_dict(),
            "step": 10,
            "provenance": {"tokenizer_sha256": sha256_file(tok_path), "examples_manifest_sha256": "0" * 64},
        },
    )
    with pytest.raises(BertraceError, match=r"best\.pt: a pre-LN encoder \(pretrain\.model\.pre_ln: true\)"):
        export_hf(tmp_path / "best.pt", tmp_path / "hf", tokenizer_path=tok_path)
    assert not (tmp_path / "hf").exists()


def test_a_mean_pooled_classifier_predicts_batch_invariantly_and_is_refused_by_hf_export(ckpt_dir, tmp_path):
    """finetune.pooling: mean is recorded in model.pt's config: inference rebuilds the mean (padding
    masked out of it), and the HF export, whose sequence classifiers read [CLS], refuses it."""
    from pipeline.interop.export import export_hf

    make_finetuned(tmp_path / "mean", seed=5, pooling="mean", tokenizer=ckpt_dir / "tokenizer.json")
    clf = Classifier.load(tmp_path / "mean" / "model.pt")
    assert clf.model.config.classifier_pooling == "mean"
    texts = TEXTS + sentences(12, 6)
    one_by_one = np.concatenate([clf.logits([t], batch_size=1) for t in texts])
    np.testing.assert_allclose(clf.logits(texts, batch_size=7), one_by_one, atol=1e-5)
    with pytest.raises(
        BertraceError, match=r"model\.pt: its classifier pools the mean of the tokens \(finetune\.pooling: mean\)"
    ):
        export_hf(tmp_path / "mean" / "model.pt", tmp_path / "hf", tokenizer_path=ckpt_dir / "tokenizer.json")
    assert not (tmp_path / "hf").exists()


def test_export_without_transformers_is_a_clear_error(ckpt_dir, tmp_path, monkeypatch):
    from pipeline.interop import export

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(BertraceError, match=r"pip install 'bertrace\[test\]'"):
        export.export_hf(ckpt_dir / "model.pt", tmp_path / "hf")


# --------------------------------------------------------------------------------------------
# MLflow pyfunc


def test_pyfunc_log_load_predict(ckpt_dir, tmp_path):
    import mlflow
    import pandas as pd

    from pipeline.interop.pyfunc import log_pyfunc, pip_requirements

    experiment = mlflow.create_experiment("pyfunc-test", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment) as run:
        info = log_pyfunc(ckpt_dir / "model.pt", artifact_path="model")
    model = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    texts = TEXTS[:3] + sentences(10, 9)
    frame = pd.DataFrame({"sentence": texts})
    out = model.predict(frame)
    clf = Classifier.load(ckpt_dir / "model.pt")
    expected = clf.predict(texts)
    assert list(out.columns) == ["label", "label_id", "prob_neg", "prob_neu", "prob_pos"]
    assert out["label"].tolist() == [e["label"] for e in expected]
    np.testing.assert_allclose(out["prob_pos"].to_numpy(), [e["probabilities"]["pos"] for e in expected], atol=1e-6)

    local = Path(mlflow.artifacts.download_artifacts(info.model_uri, dst_path=str(tmp_path / "dl")))
    reqs = (local / "requirements.txt").read_text().split()
    assert set(pip_requirements()) <= set(reqs) and all("==" in r for r in reqs)
    assert "+" not in " ".join(reqs)  # no local version tags such as +cpu
    assert {p.split("==")[0] for p in reqs} <= {"mlflow", "torch", "tokenizers", "numpy", "pandas", "cloudpickle"}
    assert (local / "code" / "pipeline" / "evaluate" / "inference.py").is_file()
    assert not list((local / "code").rglob("__pycache__"))
    assert (local / "artifacts" / "model.pt").read_bytes() == (ckpt_dir / "model.pt").read_bytes()
    with pytest.raises(Exception, match="sentence"):  # the signature names the input column
        model.predict(pd.DataFrame({"review": ["x"]}))

    # a fresh process, outside the repo, runs the model on its own copy of the pipeline package
    code = (
        "import json, sys, mlflow.pyfunc, pandas as pd\n"
        f"m = mlflow.pyfunc.load_model({str(local)!r})\n"
        "out = m.predict(pd.DataFrame({'sentence': json.loads(sys.argv[1])}))\n"
        "import pipeline\n"
        "print(json.dumps({'pipeline': pipeline.__file__, 'labels': out['label'].tolist()}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(texts)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(result["pipeline"]).is_relative_to(local / "code")
    assert result["labels"] == [e["label"] for e in expected]


# --------------------------------------------------------------------------------------------
# CLI bodies (wired into `bertrace predict` / `bertrace export` by stages/cli/main.py)


def test_predict_cli_writes_json_lines(ckpt_dir, tmp_path, capsys):
    from stages.cli.predict import main_predict

    lines = TEXTS[:3] + sentences(7, 10)
    f = tmp_path / "in.txt"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    main_predict(["--model", str(ckpt_dir / "model.pt"), "--file", str(f)])
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = Classifier.load(ckpt_dir / "model.pt").predict(lines)
    assert [o["text"] for o in out] == lines
    assert [o["label"] for o in out] == [e["label"] for e in expected]
    assert out[2]["text"] == "Café résumé naïve ☃ 𝄞"
    for o, e in zip(out, expected):
        assert o["probabilities"] == pytest.approx(e["probabilities"], abs=1e-12)

    main_predict(["-m", str(ckpt_dir / "model.pt"), "one text", "another"])
    assert [json.loads(x)["text"] for x in capsys.readouterr().out.splitlines()] == ["one text", "another"]
    with pytest.raises(BertraceError, match="one of the two"):
        main_predict(["--model", str(ckpt_dir / "model.pt")])
    with pytest.raises(BertraceError, match="checkpoint not found"):
        main_predict(["--model", str(tmp_path / "nope.pt"), "x"])


def test_predict_cli_pairs(pair_dir, tmp_path, capsys):
    from stages.cli.predict import main_predict

    f = tmp_path / "pairs.tsv"
    f.write_text("the film\twas good\nbad plot\tdull\n", encoding="utf-8")
    main_predict(["--model", str(pair_dir / "model.pt"), "--file", str(f)])
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["text"] for o in out] == [["the film", "was good"], ["bad plot", "dull"]]
    with pytest.raises(BertraceError, match="text_a<TAB>text_b"):
        main_predict(["--model", str(pair_dir / "model.pt"), "no tab here"])


def test_export_cli(ckpt_dir, tmp_path, capsys):
    from stages.cli.predict import main_export

    main_export(["--hf", str(tmp_path / "out"), "--checkpoint", str(ckpt_dir / "model.pt")])
    msg = capsys.readouterr().out
    assert "BertForSequenceClassification" in msg and "same token ids" in msg
    assert (tmp_path / "out" / "config.json").is_file()
