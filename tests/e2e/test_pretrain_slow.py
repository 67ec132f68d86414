"""Pre-training in real processes: SIGKILL while checkpointing, DDP on 2 CPU ranks (gloo),
and the DVC stage entry point (single process and under torchrun)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.models import checkpoint as ckpt_lib
from tests.support.examples_data import make_examples

REPO = Path(__file__).resolve().parents[2]
TINY = {"preset": "tiny", "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "max_position": 64}

pytestmark = pytest.mark.slow


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update({"OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "BERTRACE_NO_MLFLOW": "1"})
    env.update(extra)
    return env


# ----------------------------------------------------------------------------- SIGKILL

CHILD = r"""
import json, os, signal, sys
from pathlib import Path
import torch
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.loop import pretrain

mode, examples, out, max_steps = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
if mode == "die-in-save":  # write half of the 3rd checkpoint file, then SIGKILL ourselves
    real, calls = torch.save, [0]
    def dying_save(obj, f, *a, **k):
        calls[0] += 1
        real(obj, f, *a, **k)
        if calls[0] == 3:
            path = getattr(f, "name", f)  # save_checkpoint passes a file object (or a wrapper of one)
            if hasattr(f, "flush"):
                f.flush()
            os.truncate(path, os.path.getsize(path) // 2)
            os.kill(os.getpid(), signal.SIGKILL)
    torch.save = dying_save
# a model big enough that writing a checkpoint takes longer than a training step
model = {"preset": "tiny", "hidden_size": 256, "num_heads": 4, "intermediate_size": 1024, "max_position": 64}
cfg = PretrainConfig(objective="mlm_nsp", embedding_init={"method": "random"}, model=model, batch_size=8, lr=1e-3, warmup=0.1, max_steps=max_steps, eval_every=0,
                     log_every=1, checkpoint_every=1, checkpoint_minutes=None, num_threads=1)
pretrain(cfg, examples_dir=examples, out_dir=out, provenance={},
         on_log=lambda s, m: "loss" in m and print(json.dumps({"step": s}), flush=True), progress=False)
"""


def _logged_steps(stdout: str) -> list[int]:
    return [json.loads(line)["step"] for line in stdout.splitlines() if line.startswith("{")]


def test_sigkill_never_leaves_a_corrupt_checkpoint(tmp_path):
    examples = make_examples(tmp_path / "ex", train_rows=256, valid_rows=16, rows_per_shard=128)
    out = tmp_path / "out"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cmd = [sys.executable, str(script)]

    # 1. killed exactly while writing: the half-written temporary never replaces last.pt
    p = subprocess.run(
        cmd + ["die-in-save", str(examples), str(out), "1000"], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert p.returncode == -signal.SIGKILL, p.stderr
    state = ckpt_lib.load_checkpoint(out / "last.pt")
    assert state["step"] == 2  # the 2nd save; the 3rd died half-way
    assert list(out.glob(".last.pt.*.tmp"))  # the torn temporary is there, beside an intact last.pt

    # 2. killed at random moments of a run that checkpoints every step
    rng = random.Random(0)
    good = state["step"]
    for _ in range(3):
        child = subprocess.Popen(
            cmd + ["run", str(examples), str(out), "1000"],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # wait for training to start (the child logs every step), then kill at a random time
        deadline = time.time() + 60
        first = child.stdout.readline()
        assert first.startswith("{"), child.stderr.read()
        assert json.loads(first)["step"] == good + 1  # resumed from the last good checkpoint
        assert time.time() < deadline
        time.sleep(rng.uniform(0.05, 0.6))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        state = torch.load(out / "last.pt", weights_only=True)  # never torn
        assert state["step"] >= good
        good = state["step"]

    # 3. a clean run resumes from the last good checkpoint, finishes, and sweeps the temporaries
    p = subprocess.run(
        cmd + ["run", str(examples), str(out), str(good + 3)], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert _logged_steps(p.stdout) == [good + 1, good + 2, good + 3]
    assert ckpt_lib.load_checkpoint(out / "last.pt")["step"] == good + 3
    assert not list(out.glob(".*.tmp"))


# ----------------------------------------------------------------------------- DDP

WORKER = r"""
import json, os, sys
from pathlib import Path
import torch, torch.distributed as dist
from pipeline.pretrain.data import PretrainingData
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.loop import pretrain

examples, base = Path(sys.argv[1]), Path(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
seen = []  # example ids this rank trained on
real = PretrainingData.epoch_batches
def spy(self, epoch, skip=0):
    for b in real(self, epoch, skip):
        if self.split == "train":
            seen.extend(b.example_ids.tolist())
        yield b
PretrainingData.epoch_batches = spy
model = json.loads(sys.argv[3])
cfg = PretrainConfig(objective="mlm_nsp", embedding_init={"method": "random"}, model=model, batch_size=16, grad_accum=2, lr=2e-3, warmup=0.1, max_steps=int(sys.argv[4]),
                     eval_every=4, log_every=2, checkpoint_every=4, checkpoint_minutes=0.001, num_threads=1)
logs = []
metrics = pretrain(cfg, examples_dir=examples, out_dir=base / f"rank{rank}", provenance={"rank": rank},
                   on_log=lambda s, m: logs.append([s, m]), progress=False)
(base / f"report{rank}.json").write_text(json.dumps({"metrics": metrics, "seen": seen, "logs": logs}))
dist.destroy_process_group()
"""


def test_ddp_two_cpu_ranks_distinct_data_identical_weights_rank0_writes(tmp_path):
    examples = make_examples(tmp_path / "ex", train_rows=320, valid_rows=40, rows_per_shard=64, row_group_size=16)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    steps = 12
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(examples),
            str(tmp_path),
            json.dumps(TINY),
            str(steps),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"report{r}.json").read_text()) for r in (0, 1))
    # ranks read distinct data (all within epoch 0: 160 rows per rank) in equal amounts:
    # 12 updates x 2 micro-batches x 4 examples (global batch 16 / 2 ranks / grad_accum 2)
    assert len(r0["seen"]) == len(r1["seen"]) == steps * 2 * 4
    assert not set(r0["seen"]) & set(r1["seen"])
    # parameters stay identical across ranks (pretrain checks this too and reports the hash)
    assert r0["metrics"]["model_sha256"] == r1["metrics"]["model_sha256"]
    assert r0["metrics"]["step"] == r1["metrics"]["step"] == steps
    assert r0["metrics"]["world_size"] == 2
    # losses are averaged over ranks: both report the same numbers
    assert r0["metrics"]["loss"] == r1["metrics"]["loss"]
    # only rank 0 writes files and calls on_log
    assert (tmp_path / "rank0" / "last.pt").exists() and (tmp_path / "rank0" / "best.pt").exists()
    assert (tmp_path / "rank0" / "pretrain_loss.csv").exists()
    assert not (tmp_path / "rank1").exists()
    assert r0["logs"] and not r1["logs"]
    # the checkpoint holds both ranks' RNG states and loads weights_only
    state = torch.load(tmp_path / "rank0" / "last.pt", weights_only=True)
    assert len(state["rng"]) == 2 and not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])
    assert state["data_position"]["world_size"] == 2 and state["step"] == steps


# ----------------------------------------------------------------------------- the stage


def _stage_dir(tmp_path: Path, **pretrain_params) -> Path:
    work = tmp_path / "work"
    make_examples(
        work / "data" / "examples",
        masking="dynamic",
        train_rows=256,
        valid_rows=32,
        rows_per_shard=64,
        row_group_size=16,
    )
    params = {
        "compute": {"kernels": "portable"},
        "pretrain": {
            "model": TINY,
            "batch_size": 16,
            "lr": 2e-3,
            "warmup": 0.1,
            "max_steps": 8,
            "eval_every": 4,
            "log_every": 2,
            "checkpoint_every": 4,
            "num_threads": 1,
            **pretrain_params,
        },
    }
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    return work


def test_stage_writes_checkpoints_metrics_plots_provenance_and_mlflow(tmp_path):
    work = _stage_dir(tmp_path)
    env = _env()
    env.pop("BERTRACE_NO_MLFLOW")  # log to the test's throw-away MLflow store
    p = subprocess.run(
        [sys.executable, "-m", "stages.pretrain"], cwd=work, env=env, capture_output=True, text=True, timeout=240
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "pretrain: step 8" in p.stdout
    metrics = json.loads((work / "reports" / "pretrain.json").read_text())
    assert metrics["step"] == 8 and metrics["completed"] and "val_mlm_loss" in metrics
    state = torch.load(work / "data" / "pretrain" / "last.pt", weights_only=True)
    manifest = work / "data" / "examples" / "manifest.json"
    from pipeline.core.io import sha256_file

    assert state["provenance"]["stage"] == "pretrain"
    assert state["provenance"]["examples_manifest_sha256"] == sha256_file(manifest)
    assert state["provenance"]["inputs"]["data/examples/manifest.json"] == sha256_file(manifest)
    assert state["provenance"]["params"]["max_steps"] == 8
    # a step budget: reproducible from the commit, and recorded so (deterministic kernels, thread count)
    assert (
        state["provenance"]["budget"]
        == metrics["budget"]
        == {"kind": "max_steps", "value": 8, "steps": 8, "deterministic": True}
    )
    assert state["provenance"]["determinism"] == {"deterministic": True, "num_threads": 1}
    assert (work / "plots" / "pretrain_loss.csv").read_text().startswith("step,tokens,lr,loss,")
    assert (work / "plots" / "pretrain_val.csv").read_text().startswith("step,tokens,val_loss,")
    record = json.loads((work / "data" / "provenance" / "pretrain.json").read_text())
    assert record["outputs"]["data/pretrain/last.pt"] == sha256_file(work / "data" / "pretrain" / "last.pt")
    # trained in the work directory (which DVC leaves alone), published to data/pretrain
    published = {p.name: sha256_file(p) for p in (work / "data" / "pretrain").rglob("*.pt")}
    assert set(published) == {"last.pt", "best.pt"}
    assert published == {p.name: sha256_file(p) for p in (work / "runs" / "resume" / "pretrain").rglob("*.pt")}
    # no times in the outputs: they are the run log's
    assert "train_seconds" not in state and not {"train_seconds", "tokens_per_s", "steps_per_s", "mfu"} & set(metrics)
    assert "tok_per_s" not in json.loads((work / "metrics" / "pretrain.json").read_text())
    assert json.loads((work / "runs" / "pretrain.json").read_text())["timings"]["train_seconds"] > 0

    import mlflow

    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=["bertrace"], filter_string="tags.`bertrace.stage` = 'pretrain'")
    assert len(runs) == 1
    run_id = runs.iloc[0]["run_id"]
    history = mlflow.tracking.MlflowClient().get_metric_history(run_id, "loss")
    assert [m.step for m in history] == [2, 4, 6, 8]
    assert runs.iloc[0]["metrics.val_mlm_loss"] == pytest.approx(metrics["val_mlm_loss"])
    assert runs.iloc[0]["metrics.final.tokens_seen"] == metrics["tokens_seen"]
    assert runs.iloc[0]["tags.bertrace.cpus"] == str(os.cpu_count())  # system info on the run
    assert runs.iloc[0]["tags.bertrace.torch"] == torch.__version__
    artifacts = [a.path for a in mlflow.tracking.MlflowClient().list_artifacts(run_id, "checkpoint")]
    assert artifacts == ["checkpoint/last.pt"]
    assert runs.iloc[0]["metrics.train_seconds"] > 0  # the timings: MLflow metrics

    # DVC deletes data/pretrain before it reruns the stage: the run resumes from the work directory
    # (here a finished run: no update) and publishes the same bytes
    shutil.rmtree(work / "data" / "pretrain")
    p = subprocess.run(
        [sys.executable, "-m", "stages.pretrain"], cwd=work, env=_env(), capture_output=True, text=True, timeout=240
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "pretrain: step 8" in p.stdout and "starting over" not in p.stdout
    assert {p.name: sha256_file(p) for p in (work / "data" / "pretrain").rglob("*.pt")} == published

    # a changed recipe on top of the checkpoint with resume: true — one clear line, exit status 2
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["pretrain"]["lr"] = 1e-3
    params["pretrain"]["resume"] = True
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    p = subprocess.run(
        [sys.executable, "-m", "stages.pretrain"], cwd=work, env=_env(), capture_output=True, text=True, timeout=240
    )
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "Traceback" not in p.stderr
    assert "lr" in p.stderr and "runs/resume/pretrain/last.pt" in p.stderr

    # resume: auto (the default, what `dvc repro` uses) starts over instead, from step 0
    params["pretrain"]["resume"] = "auto"
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    p = subprocess.run(
        [sys.executable, "-m", "stages.pretrain"], cwd=work, env=_env(), capture_output=True, text=True, timeout=240
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "not resuming, starting over" in p.stdout
    state = torch.load(work / "data" / "pretrain" / "last.pt", weights_only=True)
    assert state["train_config"]["lr"] == 1e-3 and state["step"] == 8


def test_stage_under_torchrun_two_ranks(tmp_path):
    work = _stage_dir(tmp_path, batch_size=16, max_steps=6, eval_every=3)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "stages.pretrain",
        ],
        cwd=work,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    metrics = json.loads((work / "reports" / "pretrain.json").read_text())
    assert metrics["world_size"] == 2 and metrics["step"] == 6
    state = torch.load(work / "data" / "pretrain" / "last.pt", weights_only=True)
    assert len(state["rng"]) == 2 and state["provenance"]["world_size"] == 2
