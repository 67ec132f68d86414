"""The pretrain stage's outputs are a function of code, params and data: two runs write the same
bytes (no times in checkpoints or curves; a wall-clock run keeps ``train_seconds`` to resume), the
timings are returned apart (:func:`split_timings`), and :func:`publish_dir` gives the work
directory's files to ``data/pretrain`` atomically."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pipeline.core.io import sha256_file
from pipeline.models import checkpoint as ckpt_lib
from pipeline.pretrain.checkpoint import publish_dir
from pipeline.pretrain.metrics import TIMINGS, split_timings
from tests.support.pretraining import run, small_examples, tiny_cfg

HISTORY_KEYS = {"step", "tokens", "lr", "loss", "mlm_loss", "nsp_loss", "grad_norm"}


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return small_examples(tmp_path_factory.mktemp("ex"))


def _files(directory: Path) -> dict[str, str]:
    return {p.relative_to(directory).as_posix(): sha256_file(p) for p in sorted(directory.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- no times


def test_two_runs_write_byte_identical_checkpoints_and_curves(examples, tmp_path):
    cfg = tiny_cfg(max_steps=8, eval_every=4, checkpoint_every=3, log_every=2, snapshot_steps=[4])
    first, _ = run(cfg, examples, tmp_path / "a")
    second, _ = run(cfg, examples, tmp_path / "b")
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert set(a) == {"last.pt", "best.pt", "snapshots/step-000004.pt", "pretrain_loss.csv", "pretrain_val.csv"}
    assert a == b
    assert first["model_sha256"] == second["model_sha256"]
    # what pretrain() returns: the metrics (reports/pretrain.json) the same, the timings apart
    (m1, t1), (m2, _) = split_timings(first), split_timings(second)
    assert m1 == m2 and not set(TIMINGS) & set(m1)
    assert set(t1) == {"train_seconds", "tokens_per_s", "steps_per_s", "mfu"} and t1["train_seconds"] > 0


def test_a_step_budget_checkpoint_holds_no_time_a_wall_clock_one_keeps_train_seconds(examples, tmp_path):
    run(tiny_cfg(max_steps=4, eval_every=2), examples, tmp_path / "steps")
    last = ckpt_lib.load_checkpoint(tmp_path / "steps" / "last.pt")
    best = ckpt_lib.load_checkpoint(tmp_path / "steps" / "best.pt")
    assert "train_seconds" not in last and "train_seconds" not in best
    assert "finished" not in last["provenance"]
    train_rows = [r for r in last["history"] if "loss" in r]
    assert train_rows and all(set(r) == HISTORY_KEYS for r in train_rows)
    assert all("seconds" not in r and "tokens_per_s" not in r for r in last["history"])
    # a time budget: the clock decides the run, and its resume continues the clock
    metrics, _ = run(tiny_cfg(max_steps=None, time_minutes=0.01, warmup=0.1), examples, tmp_path / "time")
    timed = ckpt_lib.load_checkpoint(tmp_path / "time" / "last.pt")
    assert timed["train_seconds"] == pytest.approx(metrics["train_seconds"], abs=1e-3) and timed["train_seconds"] >= 0.6
    assert all("seconds" not in r and "tokens_per_s" not in r for r in timed["history"])
    # minute checkpoints (wall clock too) keep it; a resume of such a run continues from it
    cfg = tiny_cfg(max_steps=3, checkpoint_minutes=10.0)
    run(cfg, examples, tmp_path / "minutes", stop_at_step=2)
    before = ckpt_lib.load_checkpoint(tmp_path / "minutes" / "last.pt")["train_seconds"]
    done, _ = run(cfg, examples, tmp_path / "minutes")
    assert before > 0 and done["train_seconds"] > before


# ----------------------------------------------------------------------------- publish


def _work_dir(root: Path) -> Path:
    work = root / "runs" / "resume" / "pretrain"
    (work / "snapshots").mkdir(parents=True)
    (work / "last.pt").write_bytes(b"last weights")
    (work / "best.pt").write_bytes(b"best weights")
    (work / "snapshots" / "step-000004.pt").write_bytes(b"step 4")
    (work / ".last.pt.x1.tmp").write_bytes(b"torn")  # an atomic_path temporary: never published
    return work


def test_publish_gives_the_work_dirs_bytes_and_replaces_a_stale_directory(tmp_path):
    work = _work_dir(tmp_path)
    dst = tmp_path / "data" / "pretrain"
    dst.mkdir(parents=True)
    (dst / "last.pt").write_bytes(b"an older run")
    (dst / "stale.pt").write_bytes(b"stale")
    assert publish_dir(work, dst) == dst
    assert _files(dst) == {
        "last.pt": sha256_file(work / "last.pt"),
        "best.pt": sha256_file(work / "best.pt"),
        "snapshots/step-000004.pt": sha256_file(work / "snapshots" / "step-000004.pt"),
    }
    assert os.stat(dst / "last.pt").st_ino == os.stat(work / "last.pt").st_ino  # hard-linked, not copied
    assert sorted(p.name for p in dst.parent.iterdir()) == ["pretrain"]  # no temporary or old copy left
    assert _files(work)["last.pt"] == sha256_file(dst / "last.pt")  # the work directory stays, to resume
    # the next checkpoint is written to a new inode (atomic rename): the published bytes stay
    ckpt_lib.save_checkpoint(work / "last.pt", {"step": 1})
    assert (dst / "last.pt").read_bytes() == b"last weights"


def test_publish_copies_when_it_cannot_link(tmp_path, monkeypatch):
    work = _work_dir(tmp_path)
    dst = tmp_path / "data" / "pretrain"

    def cross_device(src, dst, *a, **k):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    publish_dir(work, dst)
    assert (dst / "best.pt").read_bytes() == b"best weights"
    assert os.stat(dst / "best.pt").st_ino != os.stat(work / "best.pt").st_ino


@pytest.mark.parametrize("where", ["copy", "rename"])
def test_a_failed_publish_leaves_the_previous_directory_intact(tmp_path, monkeypatch, where):
    work = _work_dir(tmp_path)
    dst = tmp_path / "data" / "pretrain"
    dst.mkdir(parents=True)
    (dst / "last.pt").write_bytes(b"the previous run")
    before = _files(dst)
    if where == "copy":  # linking fails, and the copy fails on the second file (e.g. a full disk)
        calls = []

        def cross_device(src, dst, *a, **k):
            raise OSError(18, "Invalid cross-device link")

        def copy_then_fail(src, dst, *a, **k):
            calls.append(src)
            if len(calls) == 2:
                raise OSError(28, "No space left on device")
            return real_copy(src, dst, *a, **k)

        real_copy = shutil.copyfile
        monkeypatch.setattr(os, "link", cross_device)
        monkeypatch.setattr(shutil, "copyfile", copy_then_fail)
    else:  # the new directory cannot be renamed into place: the previous one is put back
        real_replace = os.replace

        def refuse_the_new(src, dst, *a, **k):
            if str(src).endswith(".tmp"):
                raise OSError(16, "Device or resource busy")
            return real_replace(src, dst, *a, **k)

        monkeypatch.setattr(os, "replace", refuse_the_new)
    with pytest.raises(OSError):
        publish_dir(work, dst)
    monkeypatch.undo()
    assert _files(dst) == before
    assert sorted(p.name for p in dst.parent.iterdir()) == ["pretrain"]  # no temporary directory behind


def test_publish_needs_the_work_directory(tmp_path):
    with pytest.raises(ckpt_lib.BertraceError, match=r"runs/resume/pretrain: no such directory"):
        publish_dir(tmp_path / "runs" / "resume" / "pretrain", tmp_path / "data" / "pretrain")
    assert not (tmp_path / "data" / "pretrain").exists()


@pytest.mark.parametrize("resume", ["auto", True])
def test_a_work_directory_written_by_other_code_is_no_resume_point_under_auto(tmp_path, resume):
    """Exact resume continues a run under the code that started it: `resume: auto` empties a work
    directory whose stamp names other code (a fresh run, as in a fresh clone); `true` keeps it."""
    from pipeline.pretrain.checkpoint import CODE_STAMP, forget_other_code

    work = tmp_path / "runs/resume/pretrain"
    code = {"pipeline/pretrain/loop.py": "a" * 64, "stages/pretrain.py": "b" * 64}
    assert forget_other_code(work, code, resume) is None  # nothing to resume: only the stamp
    (work / "last.pt").write_bytes(b"x")
    assert forget_other_code(work, code, resume) is None  # the same code: kept
    assert (work / "last.pt").exists()
    edited = {**code, "pipeline/pretrain/loop.py": "c" * 64}
    note = forget_other_code(work, edited, resume)
    assert "pipeline/pretrain/loop.py" in note and "stages/pretrain.py" not in note
    assert (work / "last.pt").exists() == (resume is True)
    assert ("starting over" in note) == (resume == "auto")
    assert json.loads((work / CODE_STAMP).read_text()) == edited
