"""Profiles: overrides checked against params.yaml, turned into `dvc exp run -S` args, and the
GPU profile's pre-training smoke-tested on the CPU."""

from __future__ import annotations

import shlex

import pytest
import yaml

from pipeline.core.errors import BertraceError
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.loop import pretrain
from pipeline.reports.profiles import apply_overrides, dvc_set_args, flatten_overrides, load_profile
from tests.conftest import REPO
from tests.support.examples_data import make_examples

PARAMS = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
PROFILES = sorted(p.stem for p in (REPO / "profiles").glob("*.yaml"))


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_makes_a_valid_pretrain_config(name):
    """A profile merged into params.yaml passes PretrainConfig (e.g. one budget, not two); a
    wall-clock budget is explicitly marked in its description as not reproducible."""
    profile = load_profile(name, REPO / "profiles")
    merged = apply_overrides(PARAMS, flatten_overrides(profile, PARAMS, source=name))
    cfg = PretrainConfig.from_params(merged["pretrain"])
    if cfg.budget_kind == "time_minutes":
        raw = yaml.safe_load((REPO / "profiles" / f"{name}.yaml").read_text(encoding="utf-8"))
        assert "not reproducible" in " ".join(str(raw.get("description", "")).split()).lower()


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_names_only_existing_params(name):
    flat = flatten_overrides(load_profile(name, REPO / "profiles"), PARAMS, source=name)
    assert flat
    merged = apply_overrides(PARAMS, flat)
    for dotted, value in flat.items():
        node = merged
        for key in dotted.split("."):
            node = node[key]
        assert node == value
    assert PARAMS == yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))  # not mutated


def test_the_measured_default_differs_from_params_only_in_the_source():
    flat = flatten_overrides(load_profile("enwiki", REPO / "profiles"), PARAMS)
    assert set(flat) == {"download.source", "download.local.path"}  # only the source differs
    # the previous default: its corpus (and the NSP check's tolerance for it), BERT's objective from a random
    # embedding, and its budget; nothing downstream of pre-training
    old = flatten_overrides(load_profile("wikitext2", REPO / "profiles"), PARAMS)
    assert {k.split(".")[0] for k in old} == {"download", "examples", "validate", "pretrain"}
    assert old["pretrain.objective"] == "mlm_nsp" and old["pretrain.embedding_init.method"] == "random"
    assert PARAMS["pretrain"]["embedding_init"]["method"] == "skipgram"  # what the default adds to BERT's recipe


def test_typos_and_missing_profiles_are_clear_errors(tmp_path):
    (tmp_path / "bad.yaml").write_text("pretrain:\n  batchsize: 3\n")
    with pytest.raises(BertraceError, match=r"pretrain\.batchsize is not a key of params.yaml"):
        flatten_overrides(load_profile("bad", tmp_path), PARAMS, source="bad.yaml")
    with pytest.raises(BertraceError, match="no such profile; known profiles: \\['bad'\\]"):
        load_profile("nope", tmp_path)
    # open sections accept new keys (model overrides)
    assert flatten_overrides({"pretrain": {"model": {"num_layers": 3}}}, PARAMS) == {"pretrain.model.num_layers": 3}


def test_dvc_set_args_keep_yaml_types():
    args = dvc_set_args(
        {
            "pretrain.snapshot_minutes": [15, 30],
            "download.local.path": "../a b/c",
            "pretrain.lr": 2e-4,
            "evaluate.registered_model_name": None,
        }
    )
    assert args == [
        "-S",
        "pretrain.snapshot_minutes=[15, 30]",
        "-S",
        "download.local.path=../a b/c",
        "-S",
        "pretrain.lr=0.0002",
        "-S",
        "evaluate.registered_model_name=null",
    ]
    assert yaml.safe_load(args[1].split("=", 1)[1]) == [15, 30]
    assert shlex.split(" ".join(shlex.quote(a) for a in args)) == args
    # a key params.yaml lacks (an open section) needs Hydra's '+' for `dvc exp run -S`
    flat = flatten_overrides(load_profile("imdb", REPO / "profiles"), PARAMS)
    args = dvc_set_args(flat, PARAMS)
    assert "+finetune.task.local.train=../shared/data/imdb/train.parquet" in args
    assert "finetune.max_len=128" in args and "+finetune.max_len=128" not in args


def test_gpu_profile_pretrains_on_cpu(tmp_path):
    """Smoke test: the GPU profile's model and recipe (ELECTRA-Small-like), two updates on the CPU
    (not compiled: CPU Inductor takes minutes)."""
    merged = apply_overrides(PARAMS, flatten_overrides(load_profile("gpu", REPO / "profiles"), PARAMS))
    section = dict(merged["pretrain"])
    assert section["objective"] == "electra" and section["precision"] == "auto" and section["compile"] is True
    assert section["time_minutes"] == 10 and section["max_steps"] is None and section["deterministic"] is False
    # what the description says is what it sets; no snapshots that a 10-minute run may never reach
    description = " ".join(yaml.safe_load((REPO / "profiles" / "gpu.yaml").read_text())["description"].split())
    assert section["lr"] == 5e-4 and "peak lr 5e-4" in description and "batch 128" in description
    assert section["batch_size"] == 128 and section["electra"]["disc_weight"] == 50.0
    assert section["model"]["dropout"] == 0.0 and "no dropout" in description
    assert section["snapshot_steps"] == [] and section["snapshot_minutes"] == []
    # the embedding padded to a multiple of 64 (tensor cores): the 16k WordPiece vocabulary's 15,774 -> 15,808
    from pipeline.models.bert import config_from_params

    assert config_from_params(section["model"], 15_774).vocab_size == 15_808 and "15,808" in description
    section.update(
        time_minutes=None,
        max_steps=2,
        batch_size=4,
        grad_accum=1,
        eval_every=0,
        eval_batches=1,
        checkpoint_every=None,
        checkpoint_minutes=None,
        snapshot_minutes=[],
        device="cpu",
        num_threads=1,
        compile=False,
        model={**section["model"], "max_position": 64},
    )
    cfg = PretrainConfig.from_params(section)
    examples = make_examples(tmp_path / "ex", masking="dynamic", train_rows=32, valid_rows=8)
    metrics = pretrain(cfg, examples_dir=examples, out_dir=tmp_path / "out", provenance={}, progress=False)
    assert metrics["step"] == 2 and metrics["mfu"] is None
    from pipeline.models import checkpoint as ckpt_lib

    state = ckpt_lib.load_checkpoint(tmp_path / "out" / "last.pt")
    disc = state["model"]
    assert len({k.split(".")[2] for k in disc if k.startswith("bert.layers.")}) == 12  # ELECTRA-Small's depth
    assert disc["bert.embeddings.word.weight"].shape[1] == 128 and disc["bert.layers.0.attn.proj.weight"].shape == (
        256,
        256,
    )
    assert disc["generator.layers.11.attn.proj.weight"].shape == (64, 64)  # 1/4 width, same depth
