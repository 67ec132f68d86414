"""The task-type registry (pipeline/finetune/tasks/): the type names are compared only inside that
package, and a new type defined outside ``pipeline/`` (here: a binary target scored by one logit,
binary cross-entropy) reads its rows, fine-tunes, reports its metrics and predicts through the
unchanged loader, loop and inference code."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.finetune.loop import FinetuneConfig, evaluate_split, finetune
from pipeline.finetune.results import checkpoint_metrics
from pipeline.finetune.task_data import load_task_data, task_params
from pipeline.finetune.tasks.base import TaskType
from pipeline.finetune.tasks.registry import get, names, register, unregister
from pipeline.finetune.tasks.regression import score_labels
from pipeline.models.checkpoint import save_finetuned

REPO = Path(__file__).resolve().parents[3]
TASKS_DIR = REPO / "pipeline" / "finetune" / "tasks"

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


# ---------------------------------------------------------------------------------------------
# Type names are compared only inside pipeline/finetune/tasks/
# ---------------------------------------------------------------------------------------------
def _names_in(node: ast.AST) -> set[str]:
    """The string constants of ``node`` (a constant, or a tuple / list / set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {s for e in node.elts for s in _names_in(e)}
    return set()


def type_name_comparisons(source: str, type_names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of every ``==`` / ``!=`` / ``in`` / ``not in`` comparison and ``match`` /
    ``case`` pattern against a task-type name in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for op, left, right in zip(node.ops, [node.left, *node.comparators], node.comparators):
                if isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    found += [(node.lineno, n) for n in (_names_in(left) | _names_in(right)) & type_names]
        elif isinstance(node, ast.MatchValue):
            found += [(node.lineno, n) for n in _names_in(node.value) & type_names]
    return found


def test_task_type_names_are_compared_only_in_the_tasks_package():
    type_names = set(names())
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {name!r}"
        for package in ("pipeline", "stages")
        for path in sorted((REPO / package).rglob("*.py"))
        if TASKS_DIR not in path.parents
        for line, name in type_name_comparisons(path.read_text(encoding="utf-8"), type_names)
    ]
    assert offenders == [], "compare task types through pipeline/finetune/tasks/registry.py, not by name"


@pytest.mark.parametrize(
    "source",
    [
        "if task_type == 'regression': pass",
        "ok = t != 'classification'",
        "ok = kind in ('classification', 'token_classification')",
        "ok = 'regression' not in kinds",
        "match task_type:\n    case 'regression':\n        pass",
    ],
)
def test_the_name_check_finds_each_kind_of_comparison(source):
    assert type_name_comparisons(source, set(names()))


def test_the_name_check_ignores_other_strings_and_non_comparisons():
    source = "x = get('regression')\nif kind == 'causal_lm': pass\nd = {'classification': 1}"
    assert type_name_comparisons(source, set(names())) == []


def test_registry_names_and_unknown_type_error():
    assert names()[:3] == ("classification", "token_classification", "regression")
    assert get("regression").selection == "pearson" and get("token_classification").token_level
    with pytest.raises(BertraceError) as e:
        get("similarity")
    assert str(e.value) == (
        "params.yaml: finetune.task.type = 'similarity': input should be 'classification', "
        "'token_classification' or 'regression'; fix it in params.yaml"
    )
    with pytest.raises(ValueError, match="registered already"):
        register(get("regression"))


# ---------------------------------------------------------------------------------------------
# A task type defined outside pipeline/ runs through the real pipeline
# ---------------------------------------------------------------------------------------------
class BinaryScore(TaskType):
    """A 0/1 target in a number column, one logit, binary cross-entropy, accuracy at logit 0."""

    name: ClassVar[str] = "binary_score"
    selection: ClassVar[str] = "accuracy"
    short: ClassVar[str] = "acc"
    metric_title: ClassVar[str] = "accuracy"
    has_label_names: ClassVar[bool] = False

    def read_labels(self, rows, text_columns, label_column, label_names, role, skip):
        return score_labels(rows.columns[label_column], rows, label_column, role, skip)

    def item_label(self, split, i: int) -> Any:
        return math.nan if split.labels is None else float(split.labels[i])

    def num_outputs(self, label_names) -> int:
        return 1

    def outputs_match(self, n_names: int, num_labels: int) -> bool:
        return num_labels == 1

    def loss(self, logits, labels, reduction: str = "mean"):
        return F.binary_cross_entropy_with_logits(logits.float().squeeze(-1), labels.float(), reduction=reduction)

    def outputs(self, logits) -> list[Any]:
        return logits.squeeze(-1).cpu().tolist()

    def metrics(self, outputs, split, label_names, loss: float, n: int) -> dict:
        gold = split.labels.tolist()
        return {"accuracy": sum((o > 0) == (g > 0.5) for o, g in zip(outputs, gold)) / n, "loss": loss, "n": n}

    def format_predictions(self, logits, label_names) -> list[dict[str, Any]]:
        return [{"probability": 1.0 / (1.0 + math.exp(-float(row[0])))} for row in logits]


@pytest.fixture
def binary_score():
    task = register(BinaryScore())
    yield task
    unregister(task.name)
    assert task.name not in names()


def test_a_new_task_type_reads_fine_tunes_scores_and_predicts(binary_score, env, tmp_path):
    from pipeline.evaluate.inference import Classifier

    task = {**env["task"], "type": "binary_score", "label_names": []}
    assert task_params(task)["type"] == "binary_score"
    with pytest.raises(BertraceError, match="'regression' or 'binary_score'"):
        task_params({**task, "type": "multi_label"})
    data = load_task_data(task, env["tokenizer"], max_len=32)
    train = data.splits["train"]
    assert data.num_labels == 1 and train.labels.dtype == torch.float32 and set(train.labels.tolist()) == {0.0, 1.0}
    assert isinstance(train[0][2], float)

    cfg = FinetuneConfig.from_params(
        {
            "task": task,
            "epochs": 6,
            "seeds": [0],
            "batch_size": 16,
            "lr": 3e-3,
            "max_len": 32,
            "dropout": 0.0,
            "patience": 0,
        }
    )
    summary, best = finetune(env["ckpt"], data, cfg, progress=False)
    assert summary["task_type"] == "binary_score" and summary["best_seed"] == 0
    assert list(summary["validation_accuracy"]) == ["mean", "std", "min", "max"]
    assert best.score == best.validation["accuracy"] == summary["best_validation_accuracy"]
    assert best.score > 0.9  # 'good' vs 'bad' is trivially learnable
    assert [k for k in best.history[0] if k.startswith("validation_")] == ["validation_accuracy", "validation_loss"]
    metrics = checkpoint_metrics(summary, best, cfg.seeds)
    assert metrics["task_type"] == "binary_score" and metrics["validation_accuracy_mean"] == best.score

    path = save_finetuned(
        tmp_path / "model.pt",
        state_dict=best.state_dict,
        model_config=env["ckpt"]["model_config"],
        label_names=data.label_names,
        task=data.task_info(),
        tokenizer_sha256=sha256_file(env["tokenizer_path"]),
        mode="full",
        seed=best.seed,
        metrics=metrics,
        provenance={},
        num_labels=data.num_labels,
    )
    clf = Classifier.load(path, env["tokenizer_path"])
    assert clf.task is binary_score and clf.model.num_labels == 1
    again = evaluate_split(clf.model, data.splits["validation"], 64)
    assert again["accuracy"] == pytest.approx(best.score)
    good, bad = clf.predict(["this movie was very good", "this movie was very bad"])
    assert set(good) == {"probability"} and good["probability"] > 0.5 > bad["probability"]
