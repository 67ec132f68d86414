"""Faults: killed stages leave no MLflow run RUNNING for ever, a resumed pre-training logs its final
metrics in full, a full disk is one clear error (path, space needed) and the previous checkpoint
stays valid, and every bad input is one `error:` line naming the file or
section.key and the fix, exit status 2, no traceback."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.core.errors import BertraceError
from pipeline.core.io import DiskFull, write_json
from pipeline.models import checkpoint as ckpt_lib
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "tests"))
from tests.support.examples_data import make_examples  # noqa: E402

TINY = {"preset": "tiny", "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "max_position": 64}


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update({"OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"})
    env.update(extra)
    return env


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "a bug in bertrace" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


# ---------------------------------------------------------------------------------------------
# MLflow runs of killed stages

HOLDER = r"""
import sys, time
from stages.common import StageRun
with StageRun(sys.argv[1], {"x": 1}) as run:
    if sys.argv[2] == "child":
        import mlflow
        parent = mlflow.active_run()
        mlflow.start_run(run_name="seed-0", nested=True, experiment_id=parent.info.experiment_id,
                         tags={"bertrace.stage": sys.argv[1]})
    print(run.mlflow_run_id, flush=True)
    time.sleep(120)
"""


def _holder(stage: str, child: bool = False, **env) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, stage, "child" if child else "-"],
        cwd=REPO,
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_id = proc.stdout.readline().strip()
    assert run_id, proc.stderr.read()
    return proc, run_id


def test_a_stage_marks_the_runs_of_its_killed_attempts_killed(tmp_path, monkeypatch):
    import mlflow

    from stages.common import StageRun

    monkeypatch.chdir(tmp_path)
    client = mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])  # the holders' store
    killed, killed_id = _holder("pretrain", child=True)
    alive, alive_id = _holder("pretrain")  # another live process of the same stage (e.g. another checkout)
    other, other_id = _holder("finetune")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert client.get_run(killed_id).info.status == "RUNNING"  # what SIGKILL leaves behind
        children = client.search_runs(
            [client.get_run(killed_id).info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{killed_id}'"
        )
        assert len(children) == 1 and children[0].info.status == "RUNNING"
        with StageRun("pretrain", {"x": 1}) as run:
            pass
        assert set(run.log.stale_runs) == {killed_id, children[0].info.run_id}
        assert client.get_run(killed_id).info.status == "KILLED"
        assert client.get_run(children[0].info.run_id).info.status == "KILLED"
        assert "killed" in client.get_run(killed_id).data.tags["bertrace.killed"]
        assert client.get_run(alive_id).info.status == "RUNNING"  # alive: left alone
        assert client.get_run(other_id).info.status == "RUNNING"  # another stage: left alone
    finally:
        for p in (killed, alive, other):
            p.kill()
            p.wait(timeout=30)


def test_same_pipeline_run_marks_a_run_whose_process_cannot_be_checked(tmp_path, monkeypatch):
    """A run of another host (its process cannot be checked here) is stale only when it belongs to the
    same `dvc repro` (pipeline run id) as the stage starting now."""
    import mlflow

    from pipeline.lineage.mlflow_runs import PROCESS_TAG
    from pipeline.lineage.mlflow_store import setup_mlflow
    from stages.common import StageRun

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BERTRACE_PIPELINE_RUN_ID", "repro-1")
    experiment = setup_mlflow()
    client = mlflow.MlflowClient()
    ids = {}
    for name, run_id in (("same", "repro-1"), ("other", "repro-0")):
        r = client.create_run(
            experiment,
            tags={
                "bertrace.stage": "clean",
                "bertrace.pipeline_run_id": run_id,
                PROCESS_TAG: "elsewhere 123 456",
            },
        )
        ids[name] = r.info.run_id
    with StageRun("clean", {}) as run:
        pass
    assert run.log.stale_runs == [ids["same"]]
    assert client.get_run(ids["same"]).info.status == "KILLED"
    assert client.get_run(ids["other"]).info.status == "RUNNING"


def test_sigterm_closes_the_run_as_killed(tmp_path):
    import mlflow

    code = (
        "import time\nfrom stages.common import StageRun, run_stage\n"
        "def main():\n    with StageRun('examples', {}) as run:\n        print(run.mlflow_run_id, flush=True)\n"
        "        time.sleep(120)\nrun_stage(main)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_id = proc.stdout.readline().strip()
    assert run_id, proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130, proc.stderr.read()
    client = mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])  # the subprocess's store
    assert client.get_run(run_id).info.status == "KILLED"


# ---------------------------------------------------------------------------------------------
# Pre-training resumed at the end of its budget


def _pretrain_dir(tmp_path: Path, **params) -> Path:
    work = tmp_path / "work"
    make_examples(
        work / "data" / "examples",
        masking="static",
        train_rows=128,
        valid_rows=32,
        rows_per_shard=64,
        row_group_size=16,
    )
    cfg = {
        "model": TINY,
        "batch_size": 16,
        "lr": 2e-3,
        "warmup": 0.1,
        "max_steps": 4,
        "eval_every": 2,
        "log_every": 1,
        "checkpoint_every": 2,
        "num_threads": 1,
        "snapshot_steps": [],
        **params,
    }
    (work / "params.yaml").write_text(yaml.safe_dump({"compute": {"kernels": "portable"}, "pretrain": cfg}))
    return work


def test_a_resumed_run_with_no_step_left_logs_the_final_metrics_in_full(tmp_path, monkeypatch):
    """Killed after the final checkpoint but before metrics/pretrain.json: the rerun resumes at the end
    of the budget, trains nothing, and still reports (and logs) loss, lr, mlm_loss, nsp_loss."""
    import mlflow

    from stages import pretrain as stage

    work = _pretrain_dir(tmp_path)
    monkeypatch.chdir(work)
    threads = torch.get_num_threads()
    try:
        stage.main([])
        first = json.loads(Path("reports/pretrain.json").read_text())  # every number (metrics/: the few)
        Path("metrics/pretrain.json").unlink()  # as if killed right after the last save
        Path("reports/pretrain.json").unlink()
        stage.main([])
    finally:
        torch.set_num_threads(threads)
    again = json.loads(Path("reports/pretrain.json").read_text())
    for key in ("loss", "lr", "mlm_loss", "nsp_loss", "grad_norm", "val_mlm_loss", "step", "model_sha256"):
        assert again[key] == first[key], key
    run_log = json.loads(Path("runs/pretrain.json").read_text())  # the run fields (docs/provenance.md)
    logged = mlflow.get_run(run_log["mlflow_run_id"]).data.metrics
    assert logged["final.loss"] == pytest.approx(first["loss"]) and "final.nsp_loss" in logged


# ---------------------------------------------------------------------------------------------
# A full disk


def test_disk_full_during_a_checkpoint_save_is_one_clear_error_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    ckpt_lib.save_checkpoint(path, {"model": {"w": torch.ones(10)}, "step": 1})
    before = path.read_bytes()
    real = ckpt_lib._WriteErrors.write
    written = [0]

    def fills_up(self, data):  # the device fills after 2 KiB: the OSError torch's writer hides
        written[0] += len(data)
        if written[0] > 2048:
            self.error = OSError(errno.ENOSPC, "No space left on device")
            raise self.error
        return real(self, data)

    monkeypatch.setattr(ckpt_lib._WriteErrors, "write", fills_up)
    with pytest.raises(BertraceError) as e:
        ckpt_lib.save_checkpoint(path, {"model": {"w": torch.randn(256, 256)}, "step": 2})
    message = str(e.value)
    assert "\n" not in message and str(path) in message and "needs about 0.2 MiB" in message
    assert "MiB free" in message and "the previous last.pt is intact" in message
    assert path.read_bytes() == before and ckpt_lib.load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary left


def test_disk_full_while_writing_any_output_names_the_file(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    write_json(target, {"old": 1})

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(
        DiskFull,
        match=r"metrics.json: no space left on the device .* the previous metrics.json is "
        r"unchanged",
    ):
        write_json(target, {"new": 2})
    assert json.loads(target.read_text()) == {"old": 1} and len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize(
    "error",
    [
        "OSError(errno.ENOSPC, 'No space left on device', 'data/examples/train/shard-00001.parquet')",
        "RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598')",
    ],
)
def test_run_stage_reports_a_full_disk_in_one_line(tmp_path, error):
    code = f"import errno\nfrom stages.common import run_stage\ndef main():\n    raise {error}\nrun_stage(main)\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60
    )
    _one_line_error(proc, "no space left on the device", "free")


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /tmp"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs unshare and a user/mount namespace for a small tmpfs")
def test_pretrain_stage_on_a_full_tmpfs(tmp_path):
    """A real full device: the work directory (runs/resume/pretrain) on a tmpfs with room for the first checkpoint only."""
    work = _pretrain_dir(tmp_path, max_steps=2, checkpoint_every=2, eval_every=0)
    env = _env(BERTRACE_NO_MLFLOW="1")
    p = subprocess.run(
        [sys.executable, "-m", "stages.pretrain"], cwd=work, env=env, capture_output=True, text=True, timeout=240
    )
    assert p.returncode == 0, p.stderr[-2000:]
    size = (work / "runs" / "resume" / "pretrain" / "last.pt").stat().st_size
    (work / "params.yaml").write_text((work / "params.yaml").read_text().replace("max_steps: 2", "max_steps: 4"))
    keep = work / "keep"
    shutil.move(work / "runs" / "resume" / "pretrain", keep)
    (work / "runs" / "resume" / "pretrain").mkdir()
    room = (size * 3 // 2) // 4096 * 4096  # the old checkpoint fits, a second one beside it does not
    script = (
        f"mount -t tmpfs -o size={room} none runs/resume/pretrain && cp -a keep/. runs/resume/pretrain/ && "
        f"{sys.executable} -m stages.pretrain; rc=$?; "
        f'{sys.executable} -c "from pipeline.models.checkpoint import load_checkpoint; '
        f"print('step', load_checkpoint('runs/resume/pretrain/last.pt')['step'])\"; ls -a runs/resume/pretrain; exit $rc"
    )
    p = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=240
    )
    _one_line_error(p, "runs/resume/pretrain/", "no space left on the device", "needs about", "is intact")
    assert "step 2" in p.stdout  # the previous checkpoint is valid
    assert ".tmp" not in p.stdout  # no temporary left on the device


# ---------------------------------------------------------------------------------------------
# Bad inputs: one line, exit status 2


BAD_PARAMS = [
    ("tokenizer", {"tokenizer": {"strip_accents": "maybe"}}, ["tokenizer.strip_accents", "fix it in params.yaml"]),
    (
        "download",
        {"download": {"source": "local", "local": {"format": "documents_per_file"}}},
        ["download.local.format", "document_per_file"],
    ),
    ("evaluate", {"evaluate": {"splits": "all"}, "finetune": {}}, ["evaluate.splits", "auto or a list"]),
    ("finetune", {"finetune": {"task": {"delimiter": ";;"}}}, ["finetune.task.delimiter", "one character"]),
    ("finetune", {"finetune": {"task": {"quoting": "double"}}}, ["finetune.task.quoting", "minimal"]),
    ("finetune", {"finetune": {"task": {"separator": ";"}}}, ["finetune.task.separator: unknown key", "delimiter"]),
    ("validate", {"validate": {"max_chars_altered": 2}, "clean": {"min_chars": 1}}, ["validate.max_chars_altered"]),
    (
        "evaluate",
        {"evaluate": {"registered_model_name": "team/model"}, "finetune": {}},
        ["evaluate.registered_model_name", "cannot", "'/'"],
    ),
]


@pytest.mark.parametrize(
    "stage, params, needles", BAD_PARAMS, ids=[f"{s}-{i}" for i, (s, _, _) in enumerate(BAD_PARAMS)]
)
def test_bad_params_are_one_line_errors(tmp_path, stage, params, needles):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    proc = subprocess.run(
        [sys.executable, "-m", f"stages.{stage}"],
        cwd=tmp_path,
        env=_env(BERTRACE_NO_MLFLOW="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    _one_line_error(proc, "params.yaml", *needles)


def test_an_unreadable_csv_names_the_file_and_the_delimiter_params(tmp_path):
    (tmp_path / "train.csv").write_text('text;label\n"an unclosed quote;1\nfine;0\n', encoding="utf-8")
    code = (
        "from pathlib import Path\nfrom stages.common import run_stage\nfrom pipeline.finetune.task_files import read_table\n"
        "run_stage(lambda: read_table(Path('train.csv')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60
    )
    _one_line_error(proc, "train.csv: cannot be read as csv", "finetune.task.delimiter", "finetune.task.quoting")


def test_test_split_null_with_explicit_evaluate_splits_says_how_to_fix(tmp_path):
    from pipeline.finetune.task_data import evaluate_roles, load_task_data
    from tests.support.finetuning import synthetic_rows, train_tokenizer, write_csv

    train = write_csv(tmp_path / "train.csv", ["text", "label"], synthetic_rows(20, 0))
    task = {
        "source": "local",
        "local": {"train": str(train)},
        "text_columns": ["text"],
        "label_names": ["a", "b"],
        "splits": {"train": "train", "validation": None, "test": None},
    }
    assert evaluate_roles(task, "auto") == ["validation"]
    assert evaluate_roles(task, ["test"]) == ["test"]
    tok = train_tokenizer(tmp_path / "tok.json", [])
    from pipeline.data.tokenizer import load_tokenizer

    with pytest.raises(BertraceError, match=r"finetune.task.splits.test is empty.*evaluate.splits: auto"):
        load_task_data(task, load_tokenizer(tok), max_len=32, roles=["validation", "test"])
    data = load_task_data(task, load_tokenizer(tok), max_len=32, roles=evaluate_roles(task, "auto"))
    assert list(data.splits) == ["validation"] and len(data.splits["validation"]) == 2  # carved as fine-tuning did
