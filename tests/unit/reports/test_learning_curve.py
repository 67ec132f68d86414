"""Learning curve: snapshots (steps or minutes) + final checkpoint + scratch, each fine-tuned, as CSV/PNG/metrics."""

from __future__ import annotations

import csv
import json

import pytest
import torch
import yaml

from pipeline.core.errors import BertraceError
from pipeline.models import checkpoint as ckpt_lib
from pipeline.reports.learning_curve import curve_points


def _with_minutes(src, dst, minutes: float, scale: float, step: int | None = None):
    """A copy of ``src`` as if taken at ``minutes`` (and ``step``), weights scaled so each point differs."""
    state = ckpt_lib.load_checkpoint(src)
    state["model"] = {k: v * scale if v.is_floating_point() else v for k, v in state["model"].items()}
    state["train_seconds"] = minutes * 60
    state["step"] = int(minutes * 100) if step is None else step
    ckpt_lib.save_checkpoint(dst, {k: v for k, v in state.items() if k not in ("format", "version")})


def test_curve_points_order_and_errors(env, tmp_path):  # noqa: F811
    with pytest.raises(BertraceError, match="no best.pt or last.pt"):
        curve_points(tmp_path)
    _with_minutes(env["ckpt_path"], tmp_path / "best.pt", 40.0, 1.0)
    _with_minutes(env["ckpt_path"], tmp_path / "snapshots" / "minute-030.pt", 30.0, 1.0)
    _with_minutes(env["ckpt_path"], tmp_path / "snapshots" / "minute-015.pt", 15.0, 1.0)
    unit, pts = curve_points(tmp_path)
    assert unit == "minutes" and [p.minutes for p in pts] == [0.0, 15.0, 30.0, 40.0]
    assert [p.steps for p in pts] == [0, 1500, 3000, 4000]  # read from the checkpoints
    assert pts[0].checkpoint is None and pts[-1].checkpoint.name == "best.pt"
    _with_minutes(env["ckpt_path"], tmp_path / "snapshots" / "minute-040.pt", 40.0, 1.0)
    assert [p.minutes for p in curve_points(tmp_path)[1]] == [0.0, 15.0, 30.0, 40.0]  # final = last snapshot: once


def test_step_snapshots_make_a_steps_axis(env, tmp_path):  # noqa: F811
    """pretrain.snapshot_steps (the reproducible default): the x axis is pre-training updates."""
    _with_minutes(env["ckpt_path"], tmp_path / "best.pt", 19.0, 1.0, step=6000)
    _with_minutes(env["ckpt_path"], tmp_path / "snapshots" / "step-004000.pt", 12.5, 1.0, step=4000)
    _with_minutes(env["ckpt_path"], tmp_path / "snapshots" / "step-002000.pt", 6.0, 1.0, step=2000)
    unit, pts = curve_points(tmp_path)
    assert unit == "steps" and [p.steps for p in pts] == [0, 2000, 4000, 6000]
    assert [p.minutes for p in pts] == [0.0, 6.0, 12.5, 19.0] and pts[-1].checkpoint.name == "best.pt"
    _with_minutes(env["ckpt_path"], tmp_path / "snapshots" / "step-006000.pt", 19.0, 1.0, step=6000)
    assert [p.steps for p in curve_points(tmp_path)[1]] == [0, 2000, 4000, 6000]  # final = last snapshot: once
    # no snapshots at all: the axis follows the run's budget (a step budget here)
    for p in (tmp_path / "snapshots").glob("*.pt"):
        p.unlink()
    unit, pts = curve_points(tmp_path)
    assert unit == "steps" and [p.steps for p in pts] == [0, 6000]


def test_learning_curve_command_end_to_end(env, tmp_path, monkeypatch):  # noqa: F811
    import stages.cli.learning_curve as stage

    root = tmp_path / "repo"
    (root / "data" / "tokenizer").mkdir(parents=True)
    (root / "data" / "tokenizer" / "tokenizer.json").write_bytes(env["tokenizer_path"].read_bytes())
    _with_minutes(env["ckpt_path"], root / "data" / "pretrain" / "best.pt", 2.0, 1.0, step=40)
    _with_minutes(env["ckpt_path"], root / "data" / "pretrain" / "snapshots" / "step-000020.pt", 1.0, 0.5, step=20)
    params = {
        "compute": {"kernels": "portable"},
        "learning_curve": {"seeds": [0], "reference": {"HF route, 30 min": 82.45}},
        "finetune": {
            "tokenizer": "data/tokenizer/tokenizer.json",
            "mirror": "",
            "task": env["task"],
            "mode": "full",
            "max_len": 32,
            "epochs": 2,
            "batch_size": 16,
            "lr": 3e-3,
            "patience": 0,
            "seeds": [1, 2, 3],
        },
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    monkeypatch.chdir(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    torch.set_num_threads(1)
    stage.main(progress=False)

    rows = list(csv.DictReader(open(root / "plots" / "learning_curve.csv")))
    assert [int(r["pretrain_steps"]) for r in rows] == [0, 20, 40]
    assert [float(r["pretrain_minutes"]) for r in rows] == [0.0, 1.0, 2.0]  # both columns, always
    assert [r["checkpoint"] for r in rows] == [
        "scratch",
        "data/pretrain/snapshots/step-000020.pt",
        "data/pretrain/best.pt",
    ]
    assert all(r["seeds"] == "1" for r in rows)  # learning_curve.seeds, not finetune.seeds
    accs = [float(r["dev_accuracy"]) for r in rows]
    assert all(0.0 <= a <= 1.0 for a in accs), accs
    assert all(float(r["dev_std"]) == 0.0 for r in rows)  # one seed per point: no spread
    assert all(int(r["steps"]) > 0 for r in rows)  # every point was really fine-tuned
    # the curve names the checkpoint it belongs to (reports/plots.html draws it only while that is current)
    from pipeline.core.io import sha256_file

    assert {r["pretrain_sha256"] for r in rows} == {sha256_file(root / "data" / "pretrain" / "best.pt")}
    assert (root / "reports" / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((root / "metrics" / "learning_curve.json").read_text())
    assert saved["unit"] == "steps"
    assert saved["pretrain_checkpoint"] == {
        "path": "data/pretrain/best.pt",
        "sha256": sha256_file(root / "data" / "pretrain" / "best.pt"),
    }
    assert [p["dev_accuracy"] for p in saved["points"]] == pytest.approx(accs)


def test_curves_of_two_objectives_share_one_plot_per_corpus(env, tmp_path, monkeypatch):  # noqa: F811
    """Each run's curve is kept under its label; the PNG draws those of the same tokenizer, per minute."""
    from pipeline.reports.learning_curve import read_series, save_series

    rows = [{"pretrain_steps": 0, "pretrain_minutes": 0.0, "dev_accuracy": 0.8, "dev_std": 0.0}]
    save_series(tmp_path, "electra", {"tokenizer_sha256": "aa", "points": rows})
    save_series(tmp_path, "mlm_nsp", {"tokenizer_sha256": "aa", "points": rows})
    save_series(tmp_path, "other-corpus", {"tokenizer_sha256": "bb", "points": rows})
    assert sorted(read_series(tmp_path, "aa")) == ["electra", "mlm_nsp"]
    with pytest.raises(BertraceError, match="learning_curve.label"):
        save_series(tmp_path, "../x", {"points": rows})

    import stages.cli.learning_curve as stage

    root = tmp_path / "repo"
    (root / "data" / "tokenizer").mkdir(parents=True)
    (root / "data" / "tokenizer" / "tokenizer.json").write_bytes(env["tokenizer_path"].read_bytes())
    _with_minutes(env["ckpt_path"], root / "data" / "pretrain" / "best.pt", 2.0, 1.0, step=40)
    ft = {
        "tokenizer": "data/tokenizer/tokenizer.json",
        "mirror": "",
        "task": env["task"],
        "mode": "full",
        "max_len": 32,
        "epochs": 1,
        "batch_size": 16,
        "lr": 3e-3,
        "patience": 0,
        "seeds": [0],
    }
    monkeypatch.chdir(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    torch.set_num_threads(1)
    for label in ("first", "second"):
        (root / "params.yaml").write_text(
            yaml.safe_dump(
                {"learning_curve": {"seeds": [0], "label": label}, "compute": {"kernels": "portable"}, "finetune": ft}
            ),
            encoding="utf-8",
        )
        metrics = stage.main(progress=False)
    assert metrics["plotted"] == ["first", "second"] and metrics["unit"] == "minutes" and metrics["label"] == "second"
    kept = json.loads((root / "reports" / "learning_curves" / "first.json").read_text())
    assert kept["objective"] == "mlm_nsp" and [p["pretrain_steps"] for p in kept["points"]] == [0, 40]
