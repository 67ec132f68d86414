"""Pre-training loop and checkpoints: learning, schedule, optimizer groups, exact resume,
schedule extension, weights_only checkpoints, data-hash checks, corrupt files; the strict
config, budgets (steps reproducible, wall clock marked), snapshots, determinism, objectives."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.models import checkpoint as ckpt_lib
from pipeline.models.bert import BertConfig, BertForPreTraining, config_from_params, pretraining_loss
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.objectives.bert import BertPretraining
from pipeline.pretrain.objectives.registry import OBJECTIVES
from pipeline.pretrain.schedule import lr_at_progress, lr_at_step, warmup_steps_for
from pipeline.pretrain.trainer import step_snapshot_path
from tests.conftest import REPO
from tests.support.examples_data import make_examples, make_tokenizer
from tests.support.pretraining import TINY, run, tiny_cfg, train_logs

TIMING = ("tokens_per_s",)


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return make_examples(
        tmp_path_factory.mktemp("ex"),
        masking="static",
        train_rows=1024,
        valid_rows=64,
        rows_per_shard=256,
        row_group_size=64,
    )


def untimed(rows):
    """Logs (``on_log``) without the throughput, which no rerun reproduces (history rows hold none)."""
    return [(step, {k: v for k, v in m.items() if k not in TIMING}) for step, m in rows]


@pytest.fixture(scope="module")
def small_dynamic(tmp_path_factory):
    # 128 rows: with batch 16 an epoch is 8 updates, so short runs cross epochs
    return make_examples(
        tmp_path_factory.mktemp("dyn"),
        masking="dynamic",
        train_rows=128,
        valid_rows=32,
        rows_per_shard=48,
        row_group_size=16,
    )


# ----------------------------------------------------------------------------- learning


def test_loss_decreases_on_a_learnable_corpus(examples, tmp_path):
    model = {**TINY, "hidden_size": 64, "intermediate_size": 128}
    cfg = tiny_cfg(model=model, max_steps=200, log_every=25, eval_every=100, warmup=0.1)
    metrics, logs = run(cfg, examples, tmp_path)
    losses = [m["loss"] for _, m in train_logs(logs)]
    assert losses[0] > 5.0  # ~ln(123) + ln(2) at initialisation
    assert losses[-1] < losses[0] - 0.8, losses
    vals = [m for _, m in logs if "val_mlm_loss" in m]
    assert [s for s, m in logs if "val_mlm_loss" in m] == [100, 200]
    assert vals[-1]["val_mlm_loss"] < 4.2 and vals[-1]["val_mlm_loss"] < vals[0]["val_mlm_loss"] - 0.3
    assert math.isclose(vals[-1]["val_perplexity"], math.exp(vals[-1]["val_mlm_loss"]))
    assert 0 <= vals[-1]["val_mlm_acc"] <= 1 and 0 <= vals[-1]["val_nsp_acc"] <= 1
    assert metrics["step"] == 200 and metrics["completed"]
    assert metrics["val_mlm_loss"] == vals[-1]["val_mlm_loss"] == metrics["best_val_mlm_loss"]
    assert metrics["tokens_seen"] > 200 * 16 * 8
    assert set(train_logs(logs)[0][1]) >= {"loss", "mlm_loss", "nsp_loss", "lr", "grad_norm", "tokens_per_s"}
    # the loss curves for DVC plots
    curve = (tmp_path / "pretrain_loss.csv").read_text().splitlines()
    assert curve[0] == "step,tokens,lr,loss,mlm_loss,nsp_loss,grad_norm" and len(curve) == 1 + 8
    val = (tmp_path / "pretrain_val.csv").read_text().splitlines()
    assert len(val) == 3 and val[2].startswith("200,")
    assert (tmp_path / "best.pt").exists() and (tmp_path / "last.pt").exists()


# ----------------------------------------------------------------------------- schedule


def test_lr_schedule_warmup_peak_and_linear_decay_to_zero():
    kw = dict(peak=1e-3, warmup_steps=10, total_steps=110)
    assert lr_at_step(0, **kw) == pytest.approx(1e-4)
    assert lr_at_step(4, **kw) == pytest.approx(5e-4)
    assert lr_at_step(9, **kw) == pytest.approx(1e-3)  # peak at the end of warmup
    assert lr_at_step(10, **kw) == pytest.approx(1e-3)
    assert lr_at_step(60, **kw) == pytest.approx(5e-4)  # halfway through the decay
    assert lr_at_step(109, **kw) == pytest.approx(1e-5)
    assert lr_at_step(110, **kw) == 0.0 and lr_at_step(500, **kw) == 0.0
    assert lr_at_step(0, peak=1.0, warmup_steps=0, total_steps=4) == 1.0
    assert warmup_steps_for(0.1, 200) == 20 and warmup_steps_for(30, 200) == 30
    # wall-clock budget: the same shape over the elapsed fraction
    assert lr_at_progress(0.05, peak=1.0, warmup_fraction=0.1) == pytest.approx(0.5)
    assert lr_at_progress(0.1, peak=1.0, warmup_fraction=0.1) == pytest.approx(1.0)
    assert lr_at_progress(0.55, peak=1.0, warmup_fraction=0.1) == pytest.approx(0.5)
    assert lr_at_progress(1.0, peak=1.0, warmup_fraction=0.1) == 0.0


def test_training_applies_the_schedule_every_step(examples, tmp_path):
    cfg = tiny_cfg(max_steps=12, warmup=4, lr=1e-3)
    _, logs = run(cfg, examples, tmp_path)
    got = [m["lr"] for _, m in train_logs(logs)]
    want = [lr_at_step(s, peak=1e-3, warmup_steps=4, total_steps=12) for s in range(12)]
    assert got == pytest.approx(want)
    assert max(got) == pytest.approx(1e-3) and got[-1] == pytest.approx(1e-3 / 8)
    opt = torch.load(tmp_path / "last.pt", weights_only=True)["optimizer"]
    assert all(g["lr"] == pytest.approx(want[-1]) for g in opt["param_groups"])


def test_optimizer_excludes_bias_and_layernorm_from_weight_decay(examples, tmp_path):
    cfg = tiny_cfg(max_steps=1, weight_decay=0.05)
    run(cfg, examples, tmp_path)
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    groups = state["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]
    assert groups[0]["eps"] == 1e-6 and tuple(groups[0]["betas"]) == (0.9, 0.999)
    model = BertForPreTraining(BertConfig.from_dict(state["model_config"]))
    norm_or_bias = {
        id(p)
        for m in model.modules()
        for n, p in m.named_parameters(recurse=False)
        if isinstance(m, torch.nn.LayerNorm) or n.endswith("bias")
    }
    all_params = {id(p) for p in model.parameters()}
    assert len(groups[1]["params"]) == len(norm_or_bias) > 0
    assert len(groups[0]["params"]) == len(all_params - norm_or_bias)
    # the no-decay group holds exactly the bias/LayerNorm shapes (AdamW state follows group order)
    shapes = [tuple(state["optimizer"]["state"][i]["exp_avg"].shape) for i in groups[1]["params"]]
    assert all(len(s) == 1 for s in shapes)


def test_a_zero_budget_names_the_key_and_the_lower_bound():
    """max_steps: 0 is a budget set to nothing, not a budget left out (the others are null)."""
    with pytest.raises(BertraceError) as e:
        tiny_cfg(max_steps=0)
    assert str(e.value) == (
        "params.yaml: pretrain.max_steps = 0: a budget of nothing trains nothing; set it to at least 1 update, "
        "or to null and give the budget as epochs or time_minutes"
    )
    with pytest.raises(BertraceError, match=r"^params.yaml: pretrain.epochs = 0: .* at least a positive number"):
        tiny_cfg(max_steps=None, epochs=0)
    assert tiny_cfg(max_steps=1).max_steps == 1


def test_config_validation_errors():
    with pytest.raises(BertraceError, match="exactly one budget"):
        tiny_cfg(max_steps=10, time_minutes=5)
    with pytest.raises(BertraceError, match="exactly one budget"):
        tiny_cfg(max_steps=None)
    with pytest.raises(BertraceError, match="warmup as a fraction"):
        tiny_cfg(max_steps=None, time_minutes=1, warmup=100)
    with pytest.raises(BertraceError, match=r"pretrain\.lr_peak: unknown key; valid keys: batch_size, betas, .*warmup"):
        PretrainConfig.from_params({"lr_peak": 1.0, "max_steps": 3})
    with pytest.raises(BertraceError, match=r"pretrain\.batch_size = 10: must be a multiple of grad_accum \(4\)"):
        tiny_cfg(batch_size=10, grad_accum=4)
    with pytest.raises(BertraceError, match="pretrain.lr = 'fast': must be a number"):
        tiny_cfg(lr="fast")
    assert tiny_cfg(lr="5e-4", max_steps=10.0).lr == 5e-4  # YAML 1.1 reads 5e-4 as a string
    # strict types, each error naming pretrain.<key>
    for key, value, why in (
        ("max_steps", 2.5, "must be an integer"),
        ("max_steps", True, "not true/false"),
        ("tf32", "false", "must be true or false"),
        ("deterministic", 1, "must be true or false"),
        ("precision", "fp8", "'auto', 'fp32', 'bf16' or 'fp16'"),
        ("model", "tiny", "mapping"),
        ("betas", [0.9], "two numbers"),
        ("snapshot_steps", [0, 10], "must be > 0"),
        ("snapshot_minutes", ["soon"], "must be a number"),
        ("objective", "gpt", "must be one of .*electra, mlm, mlm_nsp"),
        ("batch_size", 0, ">= 1"),
        ("resume", "yes", "must be auto, true or false"),
        ("resume", 1, "auto, true or false"),
    ):
        with pytest.raises(BertraceError, match=rf"pretrain\.{key}.*{why}"):
            tiny_cfg(**{key: value})
    cfg = tiny_cfg(snapshot_steps=[30, 10], snapshot_minutes=[2, 1.5])
    assert cfg.snapshot_steps == [10, 30] and cfg.snapshot_minutes == [1.5, 2.0]
    with pytest.raises(BertraceError, match="pretrain.lr = -1: must be > 0"):
        cfg.lr = -1  # assignments are checked too


def test_config_defaults_are_params_yaml_and_to_dict_keeps_its_json():
    """Deleting a line of params.yaml's pretrain section changes nothing; checkpoints store
    ``to_dict()`` and resume compares it, so its JSON is the dataclass era's for the same values."""
    section = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))["pretrain"]
    assert set(section) == set(PretrainConfig.model_fields)
    assert PretrainConfig().to_dict() == PretrainConfig.from_params(section).to_dict()
    assert PretrainConfig().budget_kind == "max_steps"  # the default budget is reproducible
    d = tiny_cfg(time_minutes=40, max_steps=None, epochs=None, checkpoint_minutes=10).to_dict()
    assert d["betas"] == [0.9, 0.999] and d["time_minutes"] == 40.0 and isinstance(d["time_minutes"], float)
    assert d["checkpoint_minutes"] == 10.0 and d["max_steps"] is None and d["batch_size"] == 16
    assert json.loads(json.dumps(d)) == d


# ----------------------------------------------------------------------------- resume


def test_exact_resume_matches_an_uninterrupted_run(small_dynamic, tmp_path):
    # dropout on, dynamic masking, grad accumulation, epochs crossed, a resume point mid-epoch
    cfg = tiny_cfg(max_steps=16, grad_accum=2, eval_every=4, checkpoint_every=4, shuffle_buffer=20)
    assert config_from_params(cfg.model, vocab_size=100).dropout > 0
    full_metrics, full = run(cfg, small_dynamic, tmp_path / "full")
    part_metrics, first = run(cfg, small_dynamic, tmp_path / "parts", stop_at_step=6)
    assert part_metrics["step"] == 6 and not part_metrics["completed"]
    pos = torch.load(tmp_path / "parts" / "last.pt", weights_only=True)["data_position"]
    assert (pos["epoch"], pos["batch"]) == (0, 12)  # mid-epoch: 12 of 16 micro-batches
    _, second = run(cfg, small_dynamic, tmp_path / "parts")
    assert second[0][0] == 7  # continued, did not restart
    assert untimed(first + second) == untimed(full)  # every logged loss, lr, grad norm and val metric, bit for bit
    a = torch.load(tmp_path / "full" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "parts" / "last.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["tokens_seen"] == b["tokens_seen"] and a["history"] == b["history"]
    # no times in the checkpoint: the resumed run's last.pt is the uninterrupted run's, byte for byte
    assert sha256_file(tmp_path / "full" / "last.pt") == sha256_file(tmp_path / "parts" / "last.pt")
    done = run(cfg, small_dynamic, tmp_path / "parts")[0]  # a resume of a finished run: no step
    assert done["model_sha256"] == full_metrics["model_sha256"] and done["steps_per_s"] is None
    # a step budget's clock restarts at 0 on resume: this session trained nothing, for no time
    assert done["train_seconds"] == 0.0 and done["tokens_per_s"] is None
    # the CSV of the resumed run is the uninterrupted run's
    assert (
        (tmp_path / "full" / "pretrain_loss.csv").read_text().count("\n")
        == (tmp_path / "parts" / "pretrain_loss.csv").read_text().count("\n")
        == 17
    )


def test_resume_with_a_larger_budget_extends_the_schedule(examples, tmp_path):
    cfg = tiny_cfg(max_steps=10, warmup=2)
    _, logs = run(cfg, examples, tmp_path)
    assert train_logs(logs)[-1][1]["lr"] == pytest.approx(3e-3 / 8)
    again, _ = run(cfg, examples, tmp_path)  # same budget: nothing left to do
    assert again["step"] == 10
    metrics, more = run(tiny_cfg(max_steps=20, warmup=2), examples, tmp_path)
    steps = [s for s, _ in train_logs(more)]
    assert steps == list(range(11, 21))
    lrs = [m["lr"] for _, m in train_logs(more)]
    assert lrs[0] == pytest.approx(lr_at_step(10, peak=3e-3, warmup_steps=2, total_steps=20))
    assert lrs[0] == pytest.approx(3e-3 * 10 / 18)
    assert lrs[0] > train_logs(logs)[-1][1]["lr"]  # the rate went back up: schedule stretched
    assert all(x > 0 for x in lrs) and metrics["step"] == 20 and metrics["completed"]
    # the weights are not what max_steps 20 gives from scratch: the checkpoint and `trace` say so
    extends = [{"max_steps": 10, "at_step": 10}]
    assert metrics["budget"]["extends"] == extends
    prov = ckpt_lib.load_checkpoint(tmp_path / "last.pt")["provenance"]
    assert prov["budget"] == {"kind": "max_steps", "value": 20, "steps": 20, "deterministic": True, "extends": extends}
    from pipeline.lineage import trace_render

    node = {
        "stage": "pretrain",
        "git_commit": "abc",
        "params": tiny_cfg(max_steps=20).to_dict(),
        "budget": prov["budget"],
        "inputs": {},
        "outputs": {},
    }
    text = trace_render.format_tree({"target": "last.pt", "kind": "pre-training checkpoint", "chain": [node]})
    assert "extends a run trained under max_steps 10 (resumed at update 10): not the weights these params" in text
    # extended once more: both earlier budgets, in order
    more, _ = run(tiny_cfg(max_steps=24, warmup=2), examples, tmp_path)
    assert more["budget"]["extends"] == [*extends, {"max_steps": 20, "at_step": 20}]


def test_resume_auto_starts_a_new_budget_over(examples, tmp_path):
    """`dvc repro` after a budget change (resume: auto) gives the weights a fresh clone gives."""
    run(tiny_cfg(max_steps=6, warmup=2), examples, tmp_path / "old")
    metrics, logs = run(tiny_cfg(max_steps=10, warmup=2), examples, tmp_path / "old", resume="auto")
    assert train_logs(logs)[0][0] == 1 and "extends" not in metrics["budget"]  # started over
    fresh, _ = run(tiny_cfg(max_steps=10, warmup=2), examples, tmp_path / "fresh")
    assert metrics["model_sha256"] == fresh["model_sha256"]
    # an interrupted run with the same budget still continues
    part, _ = run(tiny_cfg(max_steps=10, warmup=2), examples, tmp_path / "parts", stop_at_step=4)
    done, rest = run(tiny_cfg(max_steps=10, warmup=2), examples, tmp_path / "parts", resume="auto")
    assert train_logs(rest)[0][0] == 5 and done["model_sha256"] == fresh["model_sha256"]


def test_epoch_budget_counts_updates_over_the_shards(small_dynamic, tmp_path):
    metrics, logs = run(tiny_cfg(max_steps=None, epochs=1.5), small_dynamic, tmp_path)
    assert metrics["step"] == 12 and metrics["epochs"] == 1.5  # 128 rows / 16 per update = 8 per epoch
    assert train_logs(logs)[-1][1]["epoch"] == 1.5


def test_dynamic_whole_word_masking_needs_the_matching_tokenizer(tmp_path):
    tok = make_tokenizer(tmp_path / "tokenizer.json")
    ex = make_examples(
        tmp_path / "ex",
        masking="dynamic",
        whole_word_masking=True,
        train_rows=64,
        valid_rows=16,
        tokenizer_sha256=sha256_file(tok),
    )
    with pytest.raises(BertraceError, match="needs the tokenizer"):
        run(tiny_cfg(max_steps=2), ex, tmp_path / "a")
    other = make_tokenizer(tmp_path / "other.json")
    other.write_text(other.read_text().replace("w9", "w9x"))
    with pytest.raises(BertraceError, match="sha256 differs"):
        run(tiny_cfg(max_steps=2), ex, tmp_path / "b", tokenizer_json=other)
    metrics, _ = run(tiny_cfg(max_steps=2), ex, tmp_path / "c", tokenizer_json=tok)
    assert metrics["step"] == 2


def test_time_budget_stops_on_the_clock(examples, tmp_path):
    cfg = tiny_cfg(max_steps=None, time_minutes=0.05, warmup=0.1)  # 3 s
    metrics, logs = run(cfg, examples, tmp_path)
    assert metrics["completed"] and metrics["train_seconds"] >= 3.0
    # a wall-clock budget resumes from the time trained: its checkpoint keeps it
    assert ckpt_lib.load_checkpoint(tmp_path / "last.pt")["train_seconds"] == pytest.approx(
        metrics["train_seconds"], abs=1e-3
    )
    lrs = [m["lr"] for _, m in train_logs(logs)]
    assert max(lrs) <= 3e-3 and lrs[-1] < 0.5 * max(lrs)  # decayed towards 0 as the clock ran out
    assert metrics["step"] == len(lrs) > 3
    # a wall-clock budget says so: in the metrics, in every checkpoint's provenance and in `trace`
    budget = {"kind": "time_minutes", "value": 0.05, "steps": None, "deterministic": False}
    assert metrics["budget"] == budget
    assert ckpt_lib.load_checkpoint(tmp_path / "last.pt")["provenance"]["budget"] == budget
    from pipeline.lineage import trace_render

    node = {"stage": "pretrain", "git_commit": "abc", "params": cfg.to_dict(), "inputs": {}, "outputs": {}}
    text = trace_render.format_tree({"target": "last.pt", "kind": "pre-training checkpoint", "chain": [node]})
    assert "wall-clock budget: not reproducible from its commit" in text
    node["params"] = tiny_cfg().to_dict()
    assert "wall-clock" not in trace_render.format_tree({"target": "x", "kind": "k", "chain": [node]})


def test_step_budget_is_recorded_as_deterministic_and_determinism_in_provenance(examples, tmp_path):
    assert not torch.are_deterministic_algorithms_enabled()
    metrics, _ = run(tiny_cfg(max_steps=3), examples, tmp_path)
    assert metrics["budget"] == {"kind": "max_steps", "value": 3, "steps": 3, "deterministic": True}
    assert metrics["deterministic"] is True and metrics["num_threads"] == 1
    prov = ckpt_lib.load_checkpoint(tmp_path / "last.pt")["provenance"]
    assert prov["budget"]["deterministic"] and prov["determinism"] == {"deterministic": True, "num_threads": 1}
    assert not torch.are_deterministic_algorithms_enabled()  # a process-wide switch: put back as found
    # on the CPU the switch changes no result, only turns a nondeterministic kernel into an error
    off, _ = run(tiny_cfg(max_steps=3, deterministic=False), examples, tmp_path / "off")
    assert off["model_sha256"] == metrics["model_sha256"]
    assert ckpt_lib.load_checkpoint(tmp_path / "off" / "last.pt")["provenance"]["determinism"]["deterministic"] is False


def test_snapshots_keep_the_weights_at_the_given_minutes(examples, tmp_path):
    cfg = tiny_cfg(max_steps=None, time_minutes=0.06, warmup=0.1, snapshot_minutes=[0.04, 0.02])  # 1.2 s, 2.4 s
    metrics, logs = run(cfg, examples, tmp_path)
    snaps = sorted((tmp_path / "snapshots").glob("*.pt"))
    assert [p.name for p in snaps] == ["minute-000.02.pt", "minute-000.04.pt"]
    early, late = (ckpt_lib.load_checkpoint(p) for p in snaps)
    assert 1.2 <= early["train_seconds"] < late["train_seconds"] < metrics["train_seconds"]
    assert 0 < early["step"] < late["step"] < metrics["step"]
    final = ckpt_lib.load_checkpoint(tmp_path / "last.pt")
    key = "bert.embeddings.word.weight"
    assert not torch.equal(late["model"][key], final["model"][key])  # the run went on training
    assert "optimizer" not in early and early["model_config"] == final["model_config"]
    # a fresh run removes the previous run's snapshots
    run(tiny_cfg(max_steps=2), examples, tmp_path, resume=False)
    assert not list((tmp_path / "snapshots").glob("*.pt"))
    with pytest.raises(BertraceError, match="snapshot_minutes"):
        tiny_cfg(snapshot_minutes=["soon"])


def test_step_snapshots_keep_the_weights_after_the_given_updates(examples, tmp_path):
    """pretrain.snapshot_steps (the default kind): snapshots/step-000004.pt holds exactly the
    weights after update 4 of this run, the same as a run stopped there (same schedule)."""
    cfg = tiny_cfg(max_steps=10, snapshot_steps=[7, 4, 20], checkpoint_every=3)
    metrics, _ = run(cfg, examples, tmp_path / "full")
    snaps = sorted((tmp_path / "full" / "snapshots").glob("*.pt"))
    assert snaps == [step_snapshot_path(tmp_path / "full", 4), step_snapshot_path(tmp_path / "full", 7)]
    assert snaps[0].name == "step-000004.pt"  # 20 is past the budget: never taken
    four = ckpt_lib.load_checkpoint(snaps[0])
    assert four["step"] == 4 and "optimizer" not in four
    run(cfg, examples, tmp_path / "stopped", stop_at_step=4)
    stopped = ckpt_lib.load_checkpoint(tmp_path / "stopped" / "last.pt")
    assert all(torch.equal(four["model"][k], stopped["model"][k]) for k in four["model"])
    # resuming does not take a snapshot twice, and the run ends where the uninterrupted one did
    resumed, _ = run(cfg, examples, tmp_path / "stopped")
    assert resumed["model_sha256"] == metrics["model_sha256"]
    assert [p.name for p in sorted((tmp_path / "stopped" / "snapshots").glob("*.pt"))] == [
        "step-000004.pt",
        "step-000007.pt",
    ]
    run(tiny_cfg(max_steps=2), examples, tmp_path / "full", resume=False)  # a fresh run drops them
    assert not list((tmp_path / "full" / "snapshots").glob("*.pt"))


# ----------------------------------------------------------------------------- checkpoints


def test_checkpoint_loads_with_weights_only_and_carries_provenance(examples, tmp_path):
    cfg = tiny_cfg(max_steps=3, eval_every=3)
    run(cfg, examples, tmp_path)
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert state["step"] == 3 and state["format"] == ckpt_lib.FORMAT
    assert set(state["rng"][0]) >= {"torch", "numpy", "python"}
    assert state["data_position"]["batch"] == 3
    prov = state["provenance"]
    assert prov["git"] == {"commit": "abc", "dirty": False}
    assert prov["tokenizer_sha256"] == json.loads((examples / "manifest.json").read_text())["tokenizer_sha256"]
    assert prov["examples_manifest_sha256"] == sha256_file(examples / "manifest.json")
    assert prov["torch"] == torch.__version__ and prov["device"] == "cpu"
    assert "finished" not in prov and "train_seconds" not in state  # no times (test_pretrain_outputs.py)
    model = BertForPreTraining(BertConfig.from_dict(state["model_config"]))
    model.load_state_dict(state["model"])
    best = torch.load(tmp_path / "best.pt", weights_only=True)
    assert best["best_val_mlm_loss"] == state["best_val_mlm_loss"] == state["metrics"]["val_mlm_loss"]
    assert "optimizer" not in best  # best.pt is the lean, weights-only kind
    # RNG states round-trip
    ckpt_lib.set_rng_state(state["rng"][0])
    x = torch.rand(3)
    ckpt_lib.set_rng_state(state["rng"][0])
    assert torch.equal(torch.rand(3), x)


def test_resume_refuses_other_data_naming_both_hashes(examples, tmp_path):
    cfg = tiny_cfg(max_steps=2)
    out = tmp_path / "ckpt"
    run(cfg, examples, out)
    old_tok = json.loads((examples / "manifest.json").read_text())["tokenizer_sha256"]
    old_manifest = sha256_file(examples / "manifest.json")
    other = make_examples(
        tmp_path / "other", train_rows=128, valid_rows=16, rows_per_shard=64, tokenizer_sha256="f" * 64
    )
    new_manifest = sha256_file(other / "manifest.json")
    with pytest.raises(BertraceError) as err:
        run(cfg, other, out)
    msg = str(err.value)
    for h in (old_tok, "f" * 64, old_manifest, new_manifest):
        assert h in msg
    assert f"delete {out}" in msg and "point the examples directory" in msg
    # resume=False starts over on the new data instead (and drops the old best.pt)
    assert (out / "best.pt").exists()
    metrics, _ = run(cfg, other, out, resume=False)
    assert metrics["step"] == 2
    assert torch.load(out / "best.pt", weights_only=True)["provenance"]["examples_manifest_sha256"] == new_manifest


def test_resume_refuses_a_different_model_config(examples, tmp_path):
    run(tiny_cfg(max_steps=2), examples, tmp_path)
    with pytest.raises(BertraceError, match="model config differs.*'num_layers': \\(2, 3\\)"):
        run(tiny_cfg(max_steps=4, model={**TINY, "num_layers": 3}), examples, tmp_path)


def test_resume_refuses_changed_recipe_params(examples, tmp_path):
    run(tiny_cfg(max_steps=2), examples, tmp_path)
    with pytest.raises(BertraceError, match=r"other pretrain params.*'lr': \(0.003, 0.001\).*Delete"):
        run(tiny_cfg(max_steps=4, lr=1e-3), examples, tmp_path)
    metrics, _ = run(tiny_cfg(max_steps=4, log_every=2, eval_every=2), examples, tmp_path)  # cadence may change
    assert metrics["step"] == 4
    # a checkpoint written before a key existed resumes when the key has its default value
    state = ckpt_lib.load_checkpoint(tmp_path / "last.pt")
    # (objective and embedding_init read as they were before they existed: mlm_nsp, random; not today's defaults)
    for key in ("objective", "embedding_init", "deterministic", "verify_shards", "snapshot_steps"):
        del state["train_config"][key]
    ckpt_lib.save_checkpoint(tmp_path / "last.pt", {k: v for k, v in state.items() if k not in ("format", "version")})
    assert run(tiny_cfg(max_steps=6), examples, tmp_path)[0]["step"] == 6


def test_missing_or_corrupt_checkpoints_are_clear_errors(examples, tmp_path):
    with pytest.raises(BertraceError, match="checkpoint not found"):
        ckpt_lib.load_checkpoint(tmp_path / "nope.pt")
    run(tiny_cfg(max_steps=2), examples, tmp_path)
    last = tmp_path / "last.pt"
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])
    with pytest.raises(BertraceError, match=r"last.pt: not a readable checkpoint.*delete it"):
        ckpt_lib.load_checkpoint(last)
    with pytest.raises(BertraceError, match="not a readable checkpoint"):  # resume never silently restarts
        run(tiny_cfg(max_steps=4), examples, tmp_path)
    last.write_bytes(b"garbage")
    with pytest.raises(BertraceError, match="not a readable checkpoint"):
        ckpt_lib.load_checkpoint(last)
    torch.save({"weights": torch.zeros(2)}, last)
    with pytest.raises(BertraceError, match="not a bertrace pre-training checkpoint"):
        ckpt_lib.load_checkpoint(last)


def test_a_failed_save_leaves_the_previous_checkpoint_intact(examples, tmp_path, monkeypatch):
    cfg = tiny_cfg(max_steps=6, checkpoint_every=2)
    run(cfg, examples, tmp_path, stop_at_step=2)
    before = (tmp_path / "last.pt").read_bytes()
    real_save = torch.save

    def crash_midway(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        f.flush()
        f.truncate(100)  # half-written ...
        raise OSError("disk full")  # ... then the writer dies

    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        run(cfg, examples, tmp_path)
    assert (tmp_path / "last.pt").read_bytes() == before
    assert not list(tmp_path.glob(".last.pt.*"))  # the temporary was removed
    monkeypatch.setattr(torch, "save", real_save)
    # what a SIGKILL mid-write leaves behind is swept on the next start, nothing else is touched
    stale = [tmp_path / ".last.pt.x1.tmp", tmp_path / ".best.pt.x2.tmp", tmp_path / ".pretrain_loss.csv.x3.tmp"]
    for f in stale + [tmp_path / "notes.tmp"]:
        f.write_bytes(b"partial")
    metrics, logs = run(cfg, examples, tmp_path)
    assert train_logs(logs)[0][0] == 3 and metrics["step"] == 6
    assert not any(f.exists() for f in stale) and (tmp_path / "notes.tmp").exists()


def test_mlm_only_trains_no_nsp_and_reports_its_loss(examples, tmp_path):
    """pretrain.objective mlm (MLM only): the objective is the MLM loss, the NSP head and the
    pooler (which only NSP trains) get no gradient, so without weight decay they keep their
    initial weights (with it they only shrink), NSP loss/accuracy are still measured."""

    def weights(nsp_weight, steps, out):
        objective = "mlm" if nsp_weight == 0 else "mlm_nsp"
        cfg = tiny_cfg(objective=objective, weight_decay=0.0, max_steps=steps, eval_every=steps, log_every=4)
        metrics, logs = run(cfg, examples, tmp_path / out)
        return metrics, logs, ckpt_lib.load_checkpoint(tmp_path / out / "last.pt")["model"]

    metrics, logs, mlm_only = weights(0.0, 12, "mlm")
    for _, m in train_logs(logs):
        assert m["loss"] == pytest.approx(m["mlm_loss"]) and m["nsp_loss"] > 0.3
    assert metrics["val_loss"] == pytest.approx(metrics["val_mlm_loss"]) and 0 <= metrics["val_nsp_acc"] <= 1
    _, _, first = weights(0.0, 1, "first")  # the same initialisation (same seed), one update
    _, _, both = weights(1.0, 12, "both")
    for name in ("nsp.weight", "bert.pooler.weight"):
        assert torch.equal(mlm_only[name], first[name])
        assert not torch.equal(both[name], first[name])
    assert not torch.equal(mlm_only["bert.embeddings.word.weight"], first["bert.embeddings.word.weight"])
    # weight decay (0.01, the default) still shrinks them: no gradient, but not untouched
    cfg = tiny_cfg(objective="mlm", weight_decay=0.01, max_steps=12)
    run(cfg, examples, tmp_path / "decayed")
    decayed = ckpt_lib.load_checkpoint(tmp_path / "decayed" / "last.pt")["model"]
    assert decayed["nsp.weight"].norm() < first["nsp.weight"].norm()
    ratio = decayed["nsp.weight"] / first["nsp.weight"]
    assert torch.allclose(ratio, ratio[0, 0])  # a uniform shrink: decay alone


def test_probe_script_trains_each_variant_for_its_minutes(examples, tmp_path):
    """bench/probe_pretrain.py: params.yaml's pretrain section + overrides per variant, a wall-clock
    budget each, one row of validation metrics per variant (docs/results.md "What limits it")."""
    import importlib.util

    import yaml

    spec = importlib.util.spec_from_file_location(
        "probe", Path(__file__).resolve().parents[3] / "bench" / "probe_pretrain.py"
    )
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    assert probe.parse_variant("lr=2e-3, objective=mlm") == {"lr": 0.002, "objective": "mlm"}
    with pytest.raises(SystemExit, match="key=value"):
        probe.parse_variant("lr")
    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "compute": {"kernels": "portable"},
                "pretrain": {**tiny_cfg().to_dict(), "max_steps": None, "resume": "auto"},
            }
        )
    )
    rows = probe.main(
        [
            "--examples",
            str(examples),
            "--params",
            str(params),
            "--minutes",
            "0.01",
            "--eval-batches",
            "2",
            "--variant",
            "",
            "--variant",
            "objective=mlm,batch_size=32",
            "--json",
            str(tmp_path / "rows.json"),
        ]
    )
    assert [r["variant"] for r in rows] == ["params.yaml", "objective=mlm,batch_size=32"]
    assert json.loads((tmp_path / "rows.json").read_text()) == rows
    for r in rows:
        assert r["steps"] >= 1 and r["tokens"] > 0 and 0 < r["val_mlm_loss"] < 10 and r["wall_s"] < 30


# ----------------------------------------------------------------------------- objectives


class _MLMOnly(BertPretraining):
    """A toy objective: the MLM alone, with its own loss names, metrics and best metric."""

    name = "mlm_only"
    loss_names = ("loss",)
    val_names = ("val_mlm", "val_acc")
    best_metric = "val_mlm"

    def losses(self, out, batch):
        return {"loss": pretraining_loss(out, batch.masked_lm_labels, batch.next_sentence_labels)[1]}

    def eval_metrics(self, sums):
        return {"val_mlm": sums[0] / sums[2], "val_acc": sums[1] / sums[2]}


def test_an_objective_is_a_class_the_loop_does_not_know(examples, tmp_path, monkeypatch):
    monkeypatch.setitem(OBJECTIVES, "mlm_only", _MLMOnly)
    # fp32 and no clipping: the clipping norm sums one norm per parameter with a gradient, and the mlm
    # objective's NSP head has (zero) gradients, so its sum has more terms, in other SIMD lanes: on AVX2
    # kernels that rounds the total norm, hence every update, differently in the last bits
    cfg = tiny_cfg(
        objective="mlm_only",
        max_steps=6,
        eval_every=3,
        log_every=2,
        weight_decay=0.0,
        precision="fp32",
        clip_grad_norm=0.0,
    )
    metrics, logs = run(cfg, examples, tmp_path)
    assert (tmp_path / "pretrain_loss.csv").read_text().splitlines()[0] == "step,tokens,lr,loss,grad_norm"
    assert (tmp_path / "pretrain_val.csv").read_text().splitlines()[0] == "step,tokens,val_mlm,val_acc"
    assert [s for s, m in logs if "val_mlm" in m] == [3, 6]
    assert metrics["best_val_mlm"] == min(m["val_mlm"] for _, m in logs if "val_mlm" in m)
    assert ckpt_lib.load_checkpoint(tmp_path / "best.pt")["best_val_mlm"] == metrics["best_val_mlm"]
    # the same updates as the mlm objective (whose NSP gradients are exact zeros)
    bert, _ = run(
        tiny_cfg(
            objective="mlm",
            max_steps=6,
            eval_every=3,
            log_every=2,
            weight_decay=0.0,
            precision="fp32",
            clip_grad_norm=0.0,
        ),
        examples,
        tmp_path / "bert",
    )
    assert metrics["model_sha256"] == bert["model_sha256"]


def test_padded_vocabulary_trains_resumes_and_records_the_tokenizer_size(examples, tmp_path):
    """``pretrain.model.pad_vocab_to_multiple_of`` (the gpu profile's 64): the checkpoint's model
    config has the padded embedding and the tokenizer's size; a resume continues it exactly."""
    model = {**TINY, "pad_vocab_to_multiple_of": 96}  # the test vocabulary has 128 ids -> 192 rows
    cfg = tiny_cfg(model=model, max_steps=6)
    full, _ = run(cfg, examples, tmp_path / "full")
    run(cfg, examples, tmp_path / "parts", stop_at_step=3)
    resumed, _ = run(cfg, examples, tmp_path / "parts")
    assert resumed["model_sha256"] == full["model_sha256"] and resumed["step"] == 6
    state = ckpt_lib.load_checkpoint(tmp_path / "full" / "last.pt")
    assert state["model_config"]["vocab_size"] == 192 and state["model_config"]["tokenizer_vocab_size"] == 128
    assert state["model"]["bert.embeddings.word.weight"].shape[0] == 192
