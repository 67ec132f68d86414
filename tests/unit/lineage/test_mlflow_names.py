"""User strings that reach MLflow (file names, column renames, split and label names) never crash a
stage: one function maps every param, tag and metric key and artifact folder to a valid, stable,
collision-free name, and the originals stay in the run's names.json / files.json artifacts.

A property test (seeded random names from many scripts and punctuation, no hypothesis needed)
checks the mapping against MLflow's own validators; the same kind of names then go through the
logging of the stages that take user strings: download (corpus file names), finetune (column
renames, split names), evaluate (label names, text columns), and a StageRun of every stage.
"""

from __future__ import annotations

import json
import random
import string
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.lineage import mlflow_names
from pipeline.lineage.mlflow_names import MAX_KEY_CHARS, is_valid_name, mlflow_name
from tests.conftest import REPO

STAGES = ["download", "clean", "tokenizer", "examples", "validate", "pretrain", "finetune", "evaluate"]
POOLS = [  # characters by script / kind
    "অআইউএকখগঘঙচছজঝটডঢণতথদধনপফবভমযরলশষসহড়ঢ়য়ৎ",
    "্ািীুূৃেৈোৌংঃঁ়",  # Bengali letters, signs
    "अआइकखगघचजटडतदनपबमयरलवशसह",
    "्ािीुूेैोौंःँ़",  # Devanagari
    "中文字符測試氧元素の日本語한국어",
    "😀🎉🚀👍🏽❤️",
    "αβγδΑΒΓάέ",
    "абвгдйё",
    "ةالعربيةُ",
    "ภาษาไทยที่นี่",
    string.ascii_letters + string.digits,
    " ()[]{}<>/\\|.,;:!?'\"`~@#$%^&*+=-_",
    "\t\n\r\x00\x1f\u200b\u200d\u202e\ufeff",
]
FIXED = [
    "অক্সিজেন.txt",
    "হাইড্রোজেন (মৌল).txt",
    "हिन्दी भाषा",
    "中文 测试",
    "emoji 😀 name",
    "Stars (1-5)",
    "a/b",
    "a//b",
    "/leading",
    "trailing/",
    "./x",
    "../x",
    "a/../b",
    ".",
    "..",
    "",
    " ",
    "x" * 300,
    "ü" * 300,
    "a:b",
    "train@main",
    "café naïve",
    "tab\tname",
    "line\nbreak",
    "quote'and\"double",
    "per_class.positive.f1",
    "bertrace.input.wiki.raw",
]


def random_names(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        pools = rng.sample(POOLS, rng.randint(1, 4))
        length = rng.choice([1, 2, 5, 12, 40, 120, 260, 320])
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(length)))
    return out


NAMES = FIXED + random_names(1500)


def mlflow_accepts(name: str) -> bool:
    """MLflow's own validators for param, metric and tag keys (and its key length limit)."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils import validation as v

    try:
        v._validate_param_name(name)
        v._validate_metric_name(name)
        v._validate_tag_name(name)
        v._validate_length_limit("key", v.MAX_ENTITY_KEY_LENGTH, name)
    except MlflowException:
        return False
    return True


def test_mlflow_name_is_valid_stable_idempotent_and_collision_free():
    mapped = {}
    for name in NAMES:
        out = mlflow_name(name)
        assert mlflow_accepts(out) and is_valid_name(out) and len(out) <= MAX_KEY_CHARS, (name, out)
        assert mlflow_name(out) == out  # a valid name stays as it is
        assert mlflow_name(name) == out  # stable
        mapped.setdefault(out, set()).add(name)
    collisions = {k: v for k, v in mapped.items() if len(v) > 1}
    assert not collisions
    # readable where it can be, with the original's hash when renamed
    assert mlflow_name("per_class.positive.f1") == "per_class.positive.f1"
    assert mlflow_name("Stars (1-5)").startswith("Stars _1-5_-") and mlflow_name("café").startswith("cafe-")
    assert mlflow_name("a" * 300)[:200] == "a" * 200 and len(mlflow_name("a" * 300)) == MAX_KEY_CHARS


def test_mlflow_name_is_the_same_in_another_process():
    sample = NAMES[:50]
    code = (
        "import json, sys; from pipeline.lineage.mlflow_names import mlflow_name; "
        "print(json.dumps([mlflow_name(n) for n in json.load(sys.stdin)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(sample),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    ).stdout
    assert json.loads(out) == [mlflow_name(n) for n in sample]


def test_helpers_flatten_cut_and_record_originals():
    renamed: dict[str, str] = {}
    params = mlflow_names.mlflow_params({"task": {"columns": {"Stars (1-5)": "label"}, "x": "v" * 7000}}, renamed)
    assert params[mlflow_name("task.columns.Stars (1-5)")] == "label" and len(params["task.x"]) == 6000
    assert renamed == {mlflow_name("task.columns.Stars (1-5)"): "task.columns.Stars (1-5)"}
    tags = mlflow_names.mlflow_tags({"bertrace.input.অক্সিজেন.txt": "x" * 9000})
    assert [len(v) for v in tags.values()] == [mlflow_names.MAX_TAG_CHARS]
    metrics = mlflow_names.mlflow_metrics({"per_class": {"ভালো": {"f1": 0.5, "n": 3, "ok": True, "name": "x"}}})
    assert sorted(metrics.values()) == [0.5, 3.0]
    assert mlflow_names.mlflow_artifact_path("evaluation/Stars (1-5)").startswith("evaluation/Stars _1-5_-")
    assert mlflow_names.mlflow_artifact_path(None) is None


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_run_logs_any_names(stage, tmp_path, monkeypatch):
    """Params, tags, metrics, inputs/outputs and artifacts named from many scripts and punctuation
    through the StageRun every stage logs with: the run finishes, nothing is lost."""
    import mlflow

    from pipeline.lineage.tracking import MAX_FILE_TAGS
    from stages.common import StageRun

    monkeypatch.chdir(tmp_path)
    names = FIXED + random_names(60, seed=STAGES.index(stage))
    params = {
        "columns": {n: "label" for n in names},
        "local": {n: f"{n}.csv" for n in names[:40]},
        "label_names": names[:10],
    }
    files = []
    for i, n in enumerate(names[:25]):  # file names as the file system allows them
        safe = "".join(c for c in n if c not in "/\x00")[:100] or f"f{i}"
        path = tmp_path / "src" / f"{i:02d} {safe}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(n, encoding="utf-8")
        files.append(path)
    with StageRun(stage, params) as run:
        for f in files:
            run.add_input(f)
        run.add_output(files[0])
        run.set_tags({f"bertrace.label.{n}": n for n in names})
        run.log_metrics({"per_class": {n: {"f1": 0.5, "support": 3} for n in names}})
        run.log_metrics({n: 1.0 for n in names[:20]}, step=2)
        run.log_artifact(files[1], f"evaluation/{names[5]}")
        run.log_artifact(files[2])
    client = mlflow.MlflowClient()
    r = client.get_run(run.mlflow_run_id)
    assert r.info.status == "FINISHED"
    distinct = {mlflow_name(f"columns.{n}") for n in names}
    assert distinct <= set(r.data.params) and len(r.data.params) == len(mlflow_names.flatten(params))
    assert len(
        [k for k in r.data.metrics if k.startswith("per_class.") or k.startswith(("per_class_", "per_class/"))]
    ) >= len(names)
    assert len([k for k in r.data.tags if k.startswith("bertrace.input.")]) == MAX_FILE_TAGS
    assert r.data.tags["bertrace.inputs"].startswith(f"{len(files)} files")
    dl = Path(client.download_artifacts(run.mlflow_run_id, "", str(tmp_path / "dl")))
    listed = json.loads((dl / "files.json").read_text())
    assert set(listed["inputs"]) == {f.as_posix() for f in files}  # the original names, whole
    originals = json.loads((dl / "names.json").read_text())
    assert set(originals.values()) >= {f"bertrace.label.{n}" for n in names if not is_valid_name(f"bertrace.label.{n}")}
    assert all(mlflow_name(orig) == key for key, orig in originals.items())


# ---------------------------------------------------------------------------------------------
# The stages that take user strings, run for real


def test_download_stage_with_file_names_in_many_scripts(tmp_path, monkeypatch):
    import mlflow

    from stages import download

    src = tmp_path / "sources"
    src.mkdir()
    names = ["অক্সিজেন", "हिन्दी भाषा", "中文 (测试)", "emoji 😀", "Ελλάδα", "a;b=c&d", "x" * 200]
    for n in names:
        (src / f"{n}.txt").write_text(f"{n} " * 40 + "\n\nsecond paragraph of " + n + "\n", encoding="utf-8")
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump(
            {
                "download": {
                    "source": "local",
                    "local": {"path": str(src), "format": "document_per_file", "title_from_filename": True},
                }
            },
            allow_unicode=True,
        ),
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    download.main()
    record = json.loads((tmp_path / "data" / "provenance" / "download.json").read_text())
    run = mlflow.get_run(json.loads((tmp_path / "runs" / "download.json").read_text())["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags[mlflow_name(f"bertrace.input.{names[0]}.txt")] == record["inputs"][f"{src}/{names[0]}.txt"]
    assert run.data.params["local.format"] == "document_per_file"


def test_finetune_stage_with_column_renames_and_split_names_mlflow_rejects(tmp_path, monkeypatch):
    """`finetune.task.columns: {"Stars (1-5)": label}` (the issue's crash) and split names with
    spaces and parentheses; the CSV is semicolon-separated (sniffed, recorded)."""
    import mlflow

    import stages.finetune as stage
    from tests.support.finetuning import make_pretrain_checkpoint, synthetic_rows, train_tokenizer

    root = tmp_path / "repo"
    (root / "data" / "tokenizer").mkdir(parents=True)
    tok = train_tokenizer(root / "data" / "tokenizer" / "tokenizer.json", [])
    make_pretrain_checkpoint(root / "data" / "pretrain" / "best.pt", tok)
    for name, rows in (("train", synthetic_rows(64, 1)), ("valid", synthetic_rows(32, 2))):
        with open(root / f"{name}.csv", "w", encoding="utf-8") as f:
            f.write("Review text;Stars (1-5)\n" + "".join(f"{t};{y}\n" for t, y in rows))
    task = {
        "source": "local",
        "local": {"Zug (de)": "train.csv", "dev / প্রথম": "valid.csv"},
        "splits": {"train": "Zug (de)", "validation": "dev / প্রথম", "test": None},
        "columns": {"Stars (1-5)": "label", "Review text": "text"},
        "text_columns": ["text"],
        "label_names": ["neg", "pos"],
    }
    (root / "params.yaml").write_text(
        yaml.safe_dump(
            {
                "compute": {"kernels": "portable"},
                "finetune": {"task": task, "max_len": 32, "epochs": 1, "batch_size": 16, "seeds": [0], "threads": 1},
            },
            allow_unicode=True,
        ),
        encoding="utf-8",
    )
    monkeypatch.chdir(root)
    stage.main(progress=False)
    run = mlflow.get_run(json.loads((root / "runs" / "finetune.json").read_text())["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params[mlflow_name("task.columns.Stars (1-5)")] == "label"
    assert run.data.params[mlflow_name("task.local.dev / প্রথম")] == "valid.csv"
    import torch

    ckpt = torch.load(root / "data" / "finetune" / "model.pt", weights_only=True)
    assert ckpt["task"]["source"]["tables"]["train.csv"] == {"delimiter": ";", "quoting": "minimal", "sniffed": True}


def test_evaluate_stage_with_label_names_and_columns_in_many_scripts(tmp_path, monkeypatch):
    """Label names become per-class metric names; the task has no test split (`splits.test: null`):
    evaluate.splits: auto scores validation only; the model is logged with its odd column name."""
    import mlflow

    from stages import evaluate as stage
    from tests.support.chain import make_finetuned, sentences

    labels = ["ভালো (good)", "খারাপ / bad", "😐 neutral", "中 立", "a:b"]
    monkeypatch.chdir(tmp_path)
    make_finetuned(tmp_path / "data" / "finetune", label_names=labels, text_columns=("Review (text)",))
    texts = sentences(40, 1)
    with open(tmp_path / "dev.csv", "w", encoding="utf-8") as f:
        f.write("Review (text)\tStars\n" + "".join(f"{t}\t{labels[i % 5]}\n" for i, t in enumerate(texts)))
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump(
            {
                "compute": {"kernels": "portable"},
                "finetune": {
                    "task": {
                        "source": "local",
                        "local": {"dev": "dev.csv", "train": "dev.csv"},
                        "splits": {"train": "train", "validation": "dev", "test": None},
                        "text_columns": ["Review (text)"],
                        "label_column": "Stars",
                        "label_names": labels,
                        "delimiter": "\t",
                    }
                },
                "evaluate": {"batch_size": 16, "log_model": True},
            },
            allow_unicode=True,
        ),
        encoding="utf-8",
    )
    metrics = stage.main(progress=False)
    assert set(metrics) == {"validation"}  # auto: no test split in the task, none asked for
    run = mlflow.get_run(json.loads((tmp_path / "runs" / "evaluate.json").read_text())["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    for label in labels:
        key = mlflow_name(f"validation.per_class.{label}.f1")
        assert run.data.metrics[key] == pytest.approx(metrics["validation"]["per_class"][label]["f1"])
    assert run.data.tags["bertrace.pyfunc_model_uri"].startswith("models:/")
