"""Sentence-pair regression (STS-B style): headerless CRLF files with extra fields, Pearson /
Spearman, the single-output MSE head in every mode, prediction, HF export, and an end-to-end
`dvc repro` of finetune -> evaluate on small data the test writes."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.core.errors import BertraceError
from pipeline.core.formats import SPECIAL_TOKENS
from pipeline.core.io import sha256_file
from pipeline.data.tokenizer import build_tokenizer, load_tokenizer
from pipeline.finetune.loop import FinetuneConfig, build_model, finetune, task_loss
from pipeline.finetune.results import checkpoint_metrics
from pipeline.finetune.task_data import load_task_data, task_params
from pipeline.finetune.task_metrics import regression_metrics, score_buckets
from pipeline.models.checkpoint import load_pretrained, save_finetuned
from tests.support.finetuning import make_pretrain_checkpoint
from tests.support.task_repos import declared_evaluate_outputs, dvc_repro, tiny_repo

HEADER = ["genre", "file", "year", "id", "score", "sentence1", "sentence2"]
WORDS = "cat dog man woman car bus plays runs eats sings red blue big small".split()


def synthetic_pairs(n: int, seed: int) -> list[tuple[str, str, float]]:
    """Pairs scored 1.25 x the number of colour words (red / blue) among B's four words: a signal
    a tiny model learns in a few hundred steps."""
    rng = random.Random(seed)
    others = [w for w in WORDS if w not in ("red", "blue")]
    out = []
    for _ in range(n):
        a = rng.sample(WORDS, 4)
        k = rng.randint(0, 4)
        b = rng.choices(["red", "blue"], k=k) + rng.sample(others, 4 - k)
        rng.shuffle(b)
        out.append((" ".join(a), " ".join(b), 1.25 * k))
    return out


def sts_lines(pairs, extra_every: int = 3) -> bytes:
    """STS Benchmark layout: headerless, tab separated, CRLF, license fields after sentence2 on some
    lines, unescaped quotes."""
    lines = []
    for i, (a, b, s) in enumerate(pairs):
        fields = ["main-captions", "MSRvid", "2012test", f"{i:04d}", f"{s:.3f}", a, b]
        if i % extra_every == 0:
            fields += ["CC-BY", 'a "quoted" source']
        lines.append("\t".join(fields))
    return ("\r\n".join(lines) + "\r\n").encode()


def sts_task(d: Path, **over) -> dict:
    t = {
        "type": "regression",
        "source": "local",
        "local": {"train": str(d / "sts-train.csv"), "validation": str(d / "sts-dev.csv")},
        "header": HEADER,
        "delimiter": "\t",
        "quoting": "none",
        "text_columns": ["sentence1", "sentence2"],
        "label_column": "score",
        "label_names": [],
        "splits": {"train": "train", "validation": "validation", "test": None},
    }
    t.update(over)
    return t


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory) -> Path:
    from tokenizers import trainers

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok = build_tokenizer(lowercase=True)
    tok.train_from_iterator(
        [" ".join(WORDS)] * 20 + ['a "quoted" source'],
        trainer=trainers.WordPieceTrainer(
            vocab_size=120, special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##", show_progress=False
        ),
    )
    path.write_text(tok.to_str(), encoding="utf-8")
    return path


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
def test_headerless_crlf_lines_with_extra_fields(tmp_path, tok_path):
    pairs = synthetic_pairs(10, 0)
    (tmp_path / "sts-train.csv").write_bytes(sts_lines(pairs))
    (tmp_path / "sts-dev.csv").write_bytes(sts_lines(pairs[:4], extra_every=100))
    data = load_task_data(sts_task(tmp_path), load_tokenizer(tok_path), max_len=32)
    train = data.splits["train"]
    assert train.labels.dtype == torch.float32 and len(train) == 10
    assert train.labels.tolist() == pytest.approx([s for _, _, s in pairs])
    assert data.num_labels == 1 and data.label_names == [] and data.task_info()["type"] == "regression"
    tok = load_tokenizer(tok_path)
    b_ids = tok.encode(pairs[0][1], add_special_tokens=False).ids
    assert train.input_ids[0][-len(b_ids) - 1 : -1] == b_ids  # sentence2 is field 7, no \r, no license field
    tables = data.source["tables"]
    assert tables[str(tmp_path / "sts-train.csv")]["extra_fields"] == 4  # lines 0, 3, 6, 9
    assert tables[str(tmp_path / "sts-dev.csv")]["extra_fields"] == 1
    (label,) = {train[i][2] for i in range(1)}
    assert isinstance(label, float)


def test_headerless_short_line_names_the_line(tmp_path, tok_path):
    good = sts_lines(synthetic_pairs(3, 0)).decode()
    (tmp_path / "sts-train.csv").write_text(good + "main\tMSRvid\t2012\t0009\t1.0\tonly one sentence\r\n", newline="")
    (tmp_path / "sts-dev.csv").write_text(good, newline="")
    with pytest.raises(BertraceError, match=r"sts-train\.csv:4: 6 fields but finetune\.task\.header names 7"):
        load_task_data(sts_task(tmp_path), load_tokenizer(tok_path), max_len=32)


def test_regression_params_are_checked(tmp_path, tok_path):
    with pytest.raises(BertraceError, match=r"label_names: \[\]"):
        task_params({"type": "regression", "label_names": ["low", "high"]})
    with pytest.raises(BertraceError, match="finetune.task.type = 'similarity'"):
        task_params({"type": "similarity"})
    with pytest.raises(BertraceError, match="finetune.task.header"):
        task_params({"header": False})
    (tmp_path / "sts-train.csv").write_bytes(
        sts_lines(synthetic_pairs(3, 0))
        .replace(b"\t5.000\t", b"\tfive\t")
        .replace(b"\t0.000\t", b"\tfive\t")
        .replace(b"\t2.500\t", b"\tfive\t")
        .replace(b"\t1.250\t", b"\tfive\t")
        .replace(b"\t3.750\t", b"\tfive\t")
    )
    (tmp_path / "sts-dev.csv").write_bytes(sts_lines(synthetic_pairs(3, 1)))
    with pytest.raises(BertraceError, match=r"sts-train\.csv: column 'score' must hold numbers.*'five'"):
        load_task_data(sts_task(tmp_path), load_tokenizer(tok_path), max_len=32)


# ---------------------------------------------------------------------------------------------
# Metrics and loss
# ---------------------------------------------------------------------------------------------
def test_pearson_spearman_mse():
    m = regression_metrics([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0])
    assert m["pearson"] == pytest.approx(0.8) and m["spearman"] == pytest.approx(0.8)
    assert m["mse"] == pytest.approx(0.5) and m["n"] == 4
    monotone = regression_metrics([0.1, 0.2, 0.3, 10.0], [1.0, 2.0, 3.0, 4.0])
    assert monotone["spearman"] == pytest.approx(1.0) and monotone["pearson"] < 0.8
    constant = regression_metrics([2.5, 2.5, 2.5], [1.0, 2.0, 4.0])  # a model that predicts the mean
    assert math.isnan(constant["pearson"]) and math.isnan(constant["spearman"])
    assert score_buckets([-0.4, 0.6, 2.5, 3.49, 5.7]) == [0, 1, 2, 3, 5]


def test_regression_head_has_one_output_and_mse_loss(tmp_path, tok_path):
    ckpt = load_pretrained(make_pretrain_checkpoint(tmp_path / "pre.pt", tok_path))
    model = build_model(ckpt, 1, "full", task_type="regression").eval()
    ids = torch.tensor([[2, 5, 6, 3, 7, 3]])
    logits = model(ids, torch.tensor([[0, 0, 0, 0, 1, 1]]), torch.ones_like(ids))
    assert logits.shape == (1, 1)
    gold = torch.tensor([3.5])
    assert task_loss(logits, gold, "regression").item() == pytest.approx(F.mse_loss(logits[:, 0], gold).item())


# ---------------------------------------------------------------------------------------------
# Training, prediction, export
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory, tok_path):
    d = tmp_path_factory.mktemp("sts")
    (d / "sts-train.csv").write_bytes(sts_lines(synthetic_pairs(400, 1)))
    (d / "sts-dev.csv").write_bytes(sts_lines(synthetic_pairs(100, 2)))
    ckpt = load_pretrained(make_pretrain_checkpoint(d / "pre.pt", tok_path))
    cfg = FinetuneConfig.from_params(
        {
            "task": sts_task(d),
            "epochs": 6,
            "seeds": [0, 1],
            "batch_size": 16,
            "lr": 2e-3,
            "max_len": 32,
            "dropout": 0.0,
            "encoder_dropout": 0.0,
        }
    )
    data = load_task_data(cfg.task, load_tokenizer(tok_path), max_len=32)
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
        seed=best.seed,
        metrics=checkpoint_metrics(summary, best, [0, 1]),
        provenance={},
        num_labels=data.num_labels,
    )
    shutil.copyfile(tok_path, out / "tokenizer.json")
    return {"ckpt": ckpt, "data": data, "cfg": cfg, "summary": summary, "best": best, "model": out / "model.pt"}


def test_full_finetuning_learns_the_similarity(trained):
    s = trained["summary"]
    assert s["task_type"] == "regression" and s["seeds"] == [0, 1]
    assert s["validation_pearson"]["mean"] > 0.5, s
    assert set(s) >= {
        "validation_pearson",
        "validation_spearman",
        "validation_mse",
        "validation_loss",
        "best_validation_pearson",
    }
    assert s["best_validation_pearson"] == max(r["validation_pearson"] for r in s["per_seed"].values())
    assert "validation_accuracy" not in s["per_seed"]["0"]
    ckpt = torch.load(trained["model"], weights_only=True)
    assert ckpt["num_labels"] == 1 and ckpt["label_names"] == [] and ckpt["task"]["type"] == "regression"
    assert ckpt["metrics"]["validation_pearson"] == pytest.approx(s["best_validation_pearson"])


@pytest.mark.parametrize("mode", ["frozen", "scratch"])
def test_frozen_and_scratch_modes_train(trained, mode):
    cfg = FinetuneConfig.from_params({**trained["cfg"].model_dump(), "mode": mode, "epochs": 1, "seeds": [0]})
    summary, best = finetune(trained["ckpt"], trained["data"], cfg, progress=False)
    assert math.isfinite(summary["validation_mse"]["mean"]) and best.state_dict is not None


def test_predict_prints_a_score(trained, capsys):
    from pipeline.evaluate.inference import Classifier
    from stages.cli.predict import main_predict

    clf = Classifier.load(trained["model"])
    a, b = "cat dog red big", "red blue red blue"
    preds = clf.predict([(a, b), (a, "bus sings cat small")])
    assert set(preds[0]) == {"score"} and preds[0]["score"] > preds[1]["score"]
    main_predict([f"{a}\t{b}", "--model", str(trained["model"])])
    line = json.loads(capsys.readouterr().out)
    assert line == {"text": [a, b], "score": pytest.approx(preds[0]["score"], abs=1e-5)}


def test_pyfunc_frame_gives_scores(trained):
    import pandas as pd

    from pipeline.evaluate.inference import Classifier
    from pipeline.interop.pyfunc import predict_frame

    frame = predict_frame(
        Classifier.load(trained["model"]),
        pd.DataFrame({"sentence1": ["cat dog", "red"], "sentence2": ["cat dog", "bus"]}),
    )
    assert list(frame.columns) == ["score"] and frame["score"].dtype == np.float64


def test_hf_export_regression_round_trip(trained, tmp_path):
    transformers = pytest.importorskip("transformers")
    from pipeline.evaluate.inference import Classifier
    from pipeline.interop.export import export_hf

    info = export_hf(trained["model"], tmp_path / "hf")
    assert info["architecture"] == "BertForSequenceClassification"
    assert info["verification"]["max_abs_logit_diff"] < 1e-5
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["problem_type"] == "regression" and len(config["id2label"]) == 1
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert hf.num_labels == 1
    clf = Classifier.load(trained["model"])
    ids, types = clf.encode([("cat dog red", "cat bus red")])
    ids, types = torch.tensor(ids), torch.tensor(types)
    with torch.no_grad():
        ours = clf.model(ids, types, torch.ones_like(ids))
        out = hf(input_ids=ids, token_type_ids=types, attention_mask=torch.ones_like(ids), labels=torch.tensor([2.0]))
    assert (ours - out.logits).abs().max().item() < 1e-5
    assert out.loss.item() == pytest.approx(F.mse_loss(ours[:, 0], torch.tensor([2.0])).item(), rel=1e-4)


# ---------------------------------------------------------------------------------------------
# End to end: dvc repro finetune -> evaluate
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_dvc_repro_regression_end_to_end(tmp_path):
    files = {
        "sts-train.csv": sts_lines(synthetic_pairs(200, 1)),
        "sts-dev.csv": sts_lines(synthetic_pairs(60, 2)),
        "sts-test.csv": sts_lines(synthetic_pairs(60, 3)),
    }
    t = {
        "type": "regression",
        "source": "local",
        "header": HEADER,
        "delimiter": "\t",
        "quoting": "none",
        "local": {
            "train": "data/sources/sts-train.csv",
            "validation": "data/sources/sts-dev.csv",
            "test": "data/sources/sts-test.csv",
        },
        "text_columns": ["sentence1", "sentence2"],
        "label_column": "score",
        "label_names": [],
    }
    root, env = tiny_repo(tmp_path / "repo", t, files)
    out = dvc_repro(root, env)
    assert "Running stage 'finetune'" in out and "Running stage 'evaluate'" in out
    for path in declared_evaluate_outputs(root):
        assert (root / path).exists(), path
    details = json.loads((root / "reports/finetune.json").read_text())
    assert details["task_type"] == "regression" and "validation_pearson" in details
    metrics = json.loads((root / "metrics/eval.json").read_text())
    assert set(metrics) == {"dev_pearson", "dev_spearman", "test_pearson", "test_spearman"}
    evaluation = json.loads((root / "reports/evaluate.json").read_text())
    assert evaluation["validation"]["pearson"] == pytest.approx(details["best_validation_pearson"], abs=1e-5)
    scatter = (root / "plots/scatter.csv").read_text().splitlines()
    assert scatter[0] == "predicted,gold" and len(scatter) == 61
    gold = sorted(float(line.split(",")[1]) for line in scatter[1:])
    assert gold == pytest.approx(sorted(s for _, _, s in synthetic_pairs(60, 2)), abs=1e-3)
    confusion = (root / "plots/confusion.csv").read_text().splitlines()
    assert confusion[0] == "actual,predicted" and {c.split(",")[0] for c in confusion[1:]} <= set("012345")
    report = (root / "reports/evaluation.md").read_text()
    assert "Pearson r" in report and "scatter.png" in report
    assert (root / "reports/scatter.png").read_bytes()[:4] == b"\x89PNG"
