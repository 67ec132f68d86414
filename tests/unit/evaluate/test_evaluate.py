"""Evaluation: metrics against scikit-learn, confusion data and picture, the markdown report with
its provenance chain, and the evaluate stage end to end on a tiny fine-tuned checkpoint.

The helpers at the top (tiny tokenizer, tiny fine-tuned checkpoint in the SPEC format) are shared
with tests/unit/interop/test_export.py.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.evaluate.report import (
    classification_metrics,
    confusion_matrix,
    evaluate_logits,
    metrics_for_dvc,
    plot_confusion,
    render_report,
    write_confusion_csv,
)
from pipeline.lineage.chain import provenance_chain
from tests.support.chain import fake_chain, make_finetuned, sentences

try:  # scikit-learn is a test extra; the helpers below are also used by tests/unit/interop/test_export.py
    import sklearn.metrics as sklearn_metrics
except ImportError:  # pragma: no cover
    sklearn_metrics = None
needs_sklearn = pytest.mark.skipif(sklearn_metrics is None, reason="scikit-learn not installed (pip install '.[test]')")

# --------------------------------------------------------------------------------------------
# Shared helpers: a tiny tokenizer and a tiny fine-tuned checkpoint (SPEC format)


# --------------------------------------------------------------------------------------------
# Metrics


def _random_predictions(n: int, k: int, never_predicted: int, seed: int):
    rng = np.random.default_rng(seed)
    y_true = rng.integers(0, k, size=n)
    y_pred = np.where(rng.random(n) < 0.6, y_true, rng.integers(0, k, size=n))
    y_pred[y_pred == never_predicted] = (never_predicted + 1) % k
    return y_true, y_pred


@needs_sklearn
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_equal_sklearn_with_a_class_never_predicted(seed):
    k, names = 4, ["a", "b", "c", "d"]
    y_true, y_pred = _random_predictions(500, k, never_predicted=2, seed=seed)
    assert 2 not in set(y_pred) and 2 in set(y_true)
    m = classification_metrics(y_true, y_pred, names)
    labels = list(range(k))
    assert m["accuracy"] == pytest.approx(sklearn_metrics.accuracy_score(y_true, y_pred), abs=1e-12)
    for avg in ("macro", "weighted"):
        ref = sklearn_metrics.f1_score(y_true, y_pred, labels=labels, average=avg, zero_division=0)
        assert m[f"{avg}_f1"] == pytest.approx(ref, abs=1e-12)
    p, r, f, s = sklearn_metrics.precision_recall_fscore_support(y_true, y_pred, labels=labels, zero_division=0)
    for i, name in enumerate(names):
        c = m["per_class"][name]
        assert (c["precision"], c["recall"], c["f1"], c["support"]) == pytest.approx(
            (p[i], r[i], f[i], s[i]), abs=1e-12
        )
    assert m["per_class"]["c"]["precision"] == 0.0 and m["per_class"]["c"]["f1"] == 0.0
    assert m["macro_precision"] == pytest.approx(p.mean(), abs=1e-12)
    assert m["confusion_matrix"] == sklearn_metrics.confusion_matrix(y_true, y_pred, labels=labels).tolist()
    assert m["n"] == 500


@needs_sklearn
def test_metrics_with_a_class_absent_from_the_labels():
    """A class in neither labels nor predictions counts in the macro mean with F1 0, as sklearn
    with ``labels=range(k)``; a class only predicted gets precision 0 and support 0."""
    y_true = np.array([0, 0, 1, 1, 1, 0])
    y_pred = np.array([0, 1, 1, 1, 3, 0])
    m = classification_metrics(y_true, y_pred, ["w", "x", "y", "z"])
    ref = sklearn_metrics.f1_score(y_true, y_pred, labels=[0, 1, 2, 3], average="macro", zero_division=0)
    assert m["macro_f1"] == pytest.approx(ref, abs=1e-12)
    assert m["weighted_f1"] == pytest.approx(
        sklearn_metrics.f1_score(y_true, y_pred, labels=[0, 1, 2, 3], average="weighted", zero_division=0), abs=1e-12
    )
    assert m["per_class"]["z"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}


@needs_sklearn
def test_loss_and_majority_from_logits():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(200, 3)) * 3
    labels = rng.integers(0, 3, size=200)
    m = evaluate_logits(logits, labels, ["x", "y", "z"])
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    assert m["loss"] == pytest.approx(sklearn_metrics.log_loss(labels, probs, labels=[0, 1, 2]), rel=1e-9)
    assert m["majority_accuracy"] == pytest.approx(np.bincount(labels).max() / 200)
    assert m["accuracy"] == pytest.approx(sklearn_metrics.accuracy_score(labels, logits.argmax(1)))
    dvc = metrics_for_dvc({"validation": m})
    assert set(dvc["validation"]) >= {"accuracy", "macro_f1", "weighted_f1", "loss", "per_class", "n"}
    assert "confusion_matrix" not in dvc["validation"]
    json.dumps(dvc)  # plain numbers only


def test_bad_inputs_are_clear_errors():
    with pytest.raises(BertraceError, match=r"class ids in \[0, 2\)"):
        confusion_matrix([0, 1, 2], [0, 1, 1], 2)
    with pytest.raises(BertraceError, match="3 labels but 2 predictions"):
        confusion_matrix([0, 1, 1], [0, 1], 2)
    with pytest.raises(BertraceError, match="no examples"):
        classification_metrics([], [], ["a", "b"])


# --------------------------------------------------------------------------------------------
# Confusion data, picture, report


def test_confusion_csv_rows_and_png(tmp_path):
    y_true, y_pred = [0, 1, 1, 2, 2, 2], [0, 1, 2, 2, 2, 0]
    names = ["neg", "neu", "pos"]
    path = write_confusion_csv(tmp_path / "plots" / "confusion.csv", y_true, y_pred, names)
    rows = list(csv.DictReader(path.open()))
    assert rows[0] == {"actual": "neg", "predicted": "neg"}
    assert [(r["actual"], r["predicted"]) for r in rows] == [(names[t], names[p]) for t, p in zip(y_true, y_pred)]

    cm = confusion_matrix(y_true, y_pred, 3)
    png = plot_confusion(tmp_path / "reports" / "confusion.png", cm, names, title="validation")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    import matplotlib.image as mpimg

    image = mpimg.imread(png)
    assert image.shape[0] > 300 and image.shape[1] > 300
    assert [p.name for p in (tmp_path / "reports").iterdir()] == ["confusion.png"]  # no temp file left


def test_report_has_numbers_baselines_and_provenance():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=300)
    logits = rng.normal(size=(300, 2)) + 2.0 * np.eye(2)[labels]
    results = {"validation": evaluate_logits(logits, labels, ["negative", "positive"])}
    m = results["validation"]
    text = render_report(
        results,
        checkpoint={"path": "data/finetune/model.pt", "sha256": "ab" * 32, "mode": "full", "seed": 7},
        baselines={"BERT-base (Devlin et al. 2019, GLUE test)": 93.5, "BERT-Tiny 2/128 (Turc et al. 2019)": 83.2},
        chain=provenance_chain(fake_chain()),
        task_name="nyu-mll/glue/sst2",
        figure="confusion.png",
        notes=["test has no labels: not scored"],
    )
    assert text.startswith("# Evaluation: nyu-mll/glue/sst2")
    assert (
        f"| validation | 300 | {100 * m['accuracy']:.2f} | {100 * m['macro_f1']:.2f} | {100 * m['weighted_f1']:.2f} |"
        in text
    )
    pc = m["per_class"]["positive"]
    assert (
        f"| positive | {100 * pc['precision']:.2f} | {100 * pc['recall']:.2f} | {100 * pc['f1']:.2f} | {pc['support']} |"
        in text
    )
    cm = m["confusion_matrix"]
    assert f"| **negative** | {cm[0][0]} | {cm[0][1]} |" in text
    assert "| BERT-base (Devlin et al. 2019, GLUE test) | 93.5 |" in text
    assert f"| majority class (validation, computed) | {100 * m['majority_accuracy']:.1f} |" in text
    assert "finetune → pretrain → examples → tokenizer → clean → download" in text
    assert "| finetune | `777777777777` | checkpoint |" in text  # stage, params hash, where the record is from
    assert "`" + "6" * 10 + "`" not in text and "git" not in text.lower()  # no commits (the run logs have them)
    assert "examples_manifest_sha256: `" + "9" * 64 + "`" in text  # full hashes listed
    assert "`" + "ab" * 32 + "`" in text
    assert "![confusion matrix](confusion.png)" in text and "test has no labels" in text
    # the same inputs give the same bytes (a DVC output must not change on a rerun)
    assert text == render_report(
        results,
        checkpoint={"path": "data/finetune/model.pt", "sha256": "ab" * 32, "mode": "full", "seed": 7},
        baselines={"BERT-base (Devlin et al. 2019, GLUE test)": 93.5, "BERT-Tiny 2/128 (Turc et al. 2019)": 83.2},
        chain=provenance_chain(fake_chain()),
        task_name="nyu-mll/glue/sst2",
        figure="confusion.png",
        notes=["test has no labels: not scored"],
    )


def test_the_provenance_section_shows_no_code_hashes_commits_or_times():
    """A record's ``code`` (its code deps' sha256) changes with an edit that changes no output, and its run
    fields (from before they moved to the run log) differ on every rebuild: neither reaches the report."""
    record = fake_chain()
    record["code"] = {"stages/finetune.py": "c0de" * 16}
    record["pretrain"]["code"] = {"pipeline/pretrain/loop.py": "dead" * 16}
    record.update(started="2026-12-01T03:00:00+00:00", finished="2026-12-01T03:05:00+00:00", seconds=300.0)
    results = {"validation": classification_metrics([0, 1, 1], [0, 1, 0], ["a", "b"])}
    text = render_report(results, checkpoint={}, chain=provenance_chain(record))
    assert "c0de" not in text and "dead" not in text and "stages/finetune.py" not in text
    assert "2026-12-01" not in text and "300" not in text
    assert text == render_report(results, checkpoint={}, chain=provenance_chain(fake_chain()))


def test_report_without_provenance_says_so():
    results = {"validation": classification_metrics([0, 1], [0, 0], ["a", "b"])}
    assert "carries no provenance record" in render_report(results, checkpoint={}, chain=[])


# --------------------------------------------------------------------------------------------
# The stage, end to end


def _write_split(path: Path, texts: list[str], labels: list[int]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["sentence", "label"])
        w.writerows(zip(texts, labels))
    return path


@needs_sklearn
def test_evaluate_stage_end_to_end(tmp_path, monkeypatch):
    from pipeline.evaluate.inference import Classifier
    from stages import evaluate as stage

    monkeypatch.chdir(tmp_path)
    # the checkpoint embeds only finetune -> pretrain; the records in data/provenance/ (no deps of
    # evaluate: they change with upstream code) do not complete its chain
    record = fake_chain()
    examples = record["pretrain"].pop("upstream")["examples"]
    model_pt = make_finetuned(tmp_path / "data" / "finetune", provenance=record)
    (tmp_path / "data" / "provenance").mkdir(parents=True)
    (tmp_path / "data" / "provenance" / "examples.json").write_text(json.dumps(examples))
    (tmp_path / "data" / "provenance" / "validate.json").write_text(
        json.dumps({"stage": "validate", "outputs": {"metrics/validate.json": "4" * 64}})
    )
    clf = Classifier.load(model_pt)
    texts = {"validation": sentences(120, 1), "test": sentences(80, 2)}
    # labels that agree with the model on ~70% of the rows, so the numbers are not trivial
    rng = np.random.default_rng(0)
    labels = {}
    for role, t in texts.items():
        pred = np.array([p["label_id"] for p in clf.predict(t)])
        labels[role] = np.where(rng.random(len(t)) < 0.7, pred, 1 - pred).tolist()
        _write_split(tmp_path / f"{role}.csv", t, labels[role])
    _eval_params(tmp_path, log_model=True)
    metrics = stage.main(progress=False)

    saved = json.loads(Path("reports/evaluate.json").read_text())  # every number; metrics/eval.json: the few
    assert saved == json.loads(json.dumps(metrics))
    assert json.loads(Path("metrics/eval.json").read_text()) == pytest.approx(
        {
            "dev_f1": saved["validation"]["macro_f1"],
            "test_acc": saved["test"]["accuracy"],
            "test_f1": saved["test"]["macro_f1"],
        }
    )
    for role in ("validation", "test"):
        pred = [p["label_id"] for p in clf.predict(texts[role])]
        assert saved[role]["accuracy"] == pytest.approx(sklearn_metrics.accuracy_score(labels[role], pred), abs=1e-12)
        assert saved[role]["macro_f1"] == pytest.approx(
            sklearn_metrics.f1_score(labels[role], pred, average="macro", zero_division=0), abs=1e-12
        )
        assert saved[role]["n"] == len(texts[role])
    rows = list(csv.DictReader(open("plots/confusion.csv")))
    assert len(rows) == 120 and set(rows[0]) == {"actual", "predicted"}
    assert Path("reports/confusion.png").read_bytes()[:4] == b"\x89PNG"
    report = Path("reports/evaluation.md").read_text()
    assert f"{100 * saved['validation']['accuracy']:.2f}" in report and "reports/references.yaml" in report
    assert "finetune → pretrain\n" in report and "| pretrain | `888888888888` | checkpoint |" in report
    provenance = report[report.index("## Provenance") :]
    assert "| examples |" not in provenance and "validate" not in report and "4444444444" not in report
    assert sha256_file(model_pt) in report
    prov = json.loads(Path("data/provenance/evaluate.json").read_text())
    assert prov["inputs"]["data/finetune/model.pt"] == sha256_file(model_pt)
    assert prov["outputs"]["reports/evaluation.md"] == sha256_file("reports/evaluation.md")
    assert prov["chain"] == ["finetune", "pretrain"]

    import mlflow

    run = mlflow.get_run(json.loads(Path("runs/evaluate.json").read_text())["mlflow_run_id"])
    assert run.data.metrics["validation.accuracy"] == pytest.approx(saved["validation"]["accuracy"])
    assert run.data.tags["bertrace.stage"] == "evaluate"
    assert run.data.tags["bertrace.pyfunc_model_uri"].startswith("models:/")


def test_evaluate_stage_rejects_a_label_set_it_was_not_trained_on(tmp_path, monkeypatch):
    from stages import evaluate as stage

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BERTRACE_NO_MLFLOW", "1")
    make_finetuned(tmp_path / "data" / "finetune")
    _write_split(tmp_path / "validation.csv", ["good film", "bad film"], [0, 2])
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump(
            {
                "compute": {"kernels": "portable"},
                "finetune": {
                    "task": {
                        "source": "local",
                        "local": {"validation": "validation.csv"},
                        "label_names": ["neg", "neu", "pos"],
                    }
                },
                "evaluate": {"splits": ["validation"]},
            }
        )
    )
    with pytest.raises(BertraceError, match=r"label_names \['neg', 'neu', 'pos'\] differ"):
        stage.main(progress=False)


def _eval_params(tmp_path: Path, log_model: bool = False) -> None:
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump(
            {
                "compute": {"kernels": "portable"},
                "finetune": {
                    "task": {
                        "source": "local",
                        "local": {"validation": "validation.csv", "test": "test.csv"},
                        "text_columns": ["sentence"],
                        "label_column": "label",
                        "label_names": ["negative", "positive"],
                    }
                },
                "evaluate": {"splits": ["validation", "test"], "batch_size": 16, "log_model": log_model},
            }
        )
    )


def test_evaluate_outputs_depend_on_its_deps_alone(tmp_path, monkeypatch):
    """evaluation.md, evaluate.json, eval.json and the scorecard row keep their bytes when only what is no
    dep of evaluate changes: the run logs (commits, times) and the records in data/provenance/ (code
    hashes); the row (from the chain the checkpoint embeds) has no minutes, commit or date."""
    from stages import evaluate as stage

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BERTRACE_NO_MLFLOW", "1")
    record = fake_chain()
    download = record["pretrain"]["upstream"]["examples"]["upstream"]["clean"]["upstream"]["download"]
    download["params"] = {"source": "local", "local": {"path": "corpus.txt"}}
    make_finetuned(tmp_path / "data" / "finetune", provenance=record)
    for role, seed in (("validation", 1), ("test", 2)):
        texts = sentences(40, seed)
        _write_split(tmp_path / f"{role}.csv", texts, [i % 2 for i in range(len(texts))])
    _eval_params(tmp_path)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "finetune.json").write_text(
        json.dumps({"validation_accuracy": {"mean": 0.6, "std": 0.01}, "n_seeds": 2})
    )
    (tmp_path / "reports" / "pretrain.json").write_text(json.dumps({"device": "cpu", "model_sha256": "a" * 64}))
    outputs = ("reports/evaluation.md", "reports/evaluate.json", "reports/scorecard.json", "metrics/eval.json")
    seen = []
    for commit, day, seconds in (("1" * 40, "2026-12-01", 60.0), ("2" * 40, "2026-12-08", 600.0)):
        (tmp_path / "runs").mkdir(exist_ok=True)
        (tmp_path / "data" / "provenance").mkdir(exist_ok=True)
        for name in ("download", "pretrain", "finetune"):
            (tmp_path / "runs" / f"{name}.json").write_text(
                json.dumps(
                    {"stage": name, "git": {"commit": commit}, "finished": f"{day}T03:00:00+00:00", "seconds": seconds}
                )
            )
            (tmp_path / "data" / "provenance" / f"{name}.json").write_text(
                json.dumps({"stage": name, "params_hash": commit, "code": {f"{name}.py": commit * 2}, "outputs": {}})
            )
        stage.main(progress=False)
        seen.append({p: Path(p).read_bytes() for p in outputs})
    assert seen[0] == seen[1]
    row = json.loads(seen[0]["reports/scorecard.json"])["this_run"]
    assert row["corpus"] == "local: corpus.txt" and row["dev_mean"] == 60.0 and row["pretrained"] is True
    assert not {"pretrain_minutes", "dag_minutes", "git_commit", "git_dirty", "date"} & set(row)
    report = seen[0]["reports/evaluation.md"].decode("utf-8")
    assert "finetune → pretrain → examples → tokenizer → clean → download" in report
    assert "2026-" not in report and "1111111111" not in report
