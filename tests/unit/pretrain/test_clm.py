"""The ``clm`` pre-training objective (pipeline/pretrain/objectives/clm.py) through the Trainer, its metrics,
exact resume, the objective/examples-mode checks, fine-tuning a causal checkpoint and loading it for
inference, and (slow) the causal DAG end to end under `dvc repro`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.data.examples import ExamplesConfig, generate_examples
from pipeline.data.tokenizer import load_tokenizer
from pipeline.evaluate.inference import Classifier
from pipeline.finetune.loop import FinetuneConfig, build_model, train_seed
from pipeline.finetune.task_data import load_task_data
from pipeline.models.bert import BertConfig
from pipeline.models.checkpoint import load_pretrained, save_checkpoint, save_finetuned
from pipeline.models.gpt import GPT, GPTForSequenceClassification, causal_lm_loss
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.data import PretrainingData, collate_packed
from pipeline.pretrain.loop import pretrain
from pipeline.pretrain.objectives.clm import CausalLM
from pipeline.pretrain.objectives.registry import OBJECTIVES
from tests.conftest import REPO, shared_file
from tests.support.examples_data import make_examples
from tests.support.finetuning import synthetic_rows, train_tokenizer, write_csv

MODEL = {
    "preset": "tiny",
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 64,
    "max_position": 64,
    "dropout": 0.0,
    "attention_dropout": 0.0,
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


TEMPLATES = [
    "the cat sat on the mat .",
    "a dog ran to the park and back .",
    "she reads a book every night .",
    "we walked along the river in the rain .",
    "the old man fed the birds .",
    "he plays the piano well .",
    "they built a house near the sea .",
    "my sister paints the sky at dawn .",
]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Documents of sentences drawn from a few templates (train and valid alike): a context model
    predicts most next tokens, a unigram model does not."""
    import random

    from tokenizers import trainers

    from pipeline.core.formats import SPECIAL_TOKENS
    from pipeline.data.tokenizer import build_tokenizer

    root = tmp_path_factory.mktemp("lm")
    rng = random.Random(0)
    for split, n in (("train", 40), ("valid", 6)):
        docs = [" ".join(rng.choice(TEMPLATES) for _ in range(rng.randint(20, 40))) for _ in range(n)]
        (root / f"{split}.txt").write_text("".join(d + "\n" for d in docs), encoding="utf-8")
    tok = build_tokenizer(lowercase=True)
    tok.train(
        [str(root / "train.txt")],
        trainers.WordPieceTrainer(
            vocab_size=200, special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##", show_progress=False
        ),
    )
    (root / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    out = root / "examples"
    cfg = ExamplesConfig(mode="causal", max_seq_len=32, docs_per_shard=16, row_group_size=16, seed=3)
    generate_examples(
        root / "train.txt", root / "valid.txt", root / "tokenizer.json", out, cfg, workers=1, progress=False
    )
    return out


def clm_cfg(**kw) -> PretrainConfig:
    base = dict(
        objective="clm",
        embedding_init={"method": "random"},
        model=MODEL,
        batch_size=8,
        lr=3e-3,
        warmup=2,
        max_steps=30,
        eval_every=10,
        eval_batches=0,
        log_every=5,
        checkpoint_every=10,
        snapshot_steps=[],
        seed=0,
        shuffle_buffer=64,
    )
    return PretrainConfig(**{**base, **kw})


def run(cfg, examples, out, **kw):
    logs: list[tuple[int, dict]] = []
    metrics = pretrain(
        cfg,
        examples_dir=examples,
        out_dir=out,
        provenance={"git": {"commit": "abc", "dirty": False}},
        on_log=lambda step, m: logs.append((step, m)),
        progress=False,
        **kw,
    )
    return metrics, logs


def test_registered_and_its_loss_is_the_shifted_cross_entropy(packed):
    assert OBJECTIVES["clm"] is CausalLM
    torch.manual_seed(0)
    model = GPT(BertConfig(vocab_size=300, **{k: v for k, v in MODEL.items() if k != "preset"}))
    ids = torch.randint(5, 300, (3, 17))
    batch = collate_packed([(r.numpy(), None, 0, None, None) for r in ids], [0, 1, 2])
    obj = CausalLM()
    model.eval()  # no dropout: the same function in every call below
    trained = obj.forward(model, batch)  # autograd on: the fused head + loss, no logits
    assert trained.logits is None
    expected = causal_lm_loss(model(ids).logits, ids)
    assert torch.allclose(obj.losses(trained, batch)["loss"], expected, rtol=1e-6, atol=1e-6)
    with torch.no_grad():  # validation: logits of every position but each block's last
        out = obj.forward(model, batch)
    assert tuple(out.logits.shape) == (3 * 16, 300)
    assert torch.allclose(obj.losses(out, batch)["loss"], expected, rtol=1e-6, atol=1e-6)
    sums = obj.eval_sums(out, batch)
    assert sums[2].item() == 48 and sums[0].item() / 48 == pytest.approx(expected.item(), rel=1e-5)


@pytest.fixture(scope="module")
def trained(packed, tmp_path_factory):
    out = tmp_path_factory.mktemp("clm")
    metrics, logs = run(clm_cfg(max_steps=80, eval_every=20), packed, out)
    return out, metrics, logs


def test_training_lowers_the_loss_and_reports_perplexity_bits_per_byte_and_the_unigram_baseline(packed, trained):
    out, metrics, logs = trained
    val = [m for _, m in logs if "val_loss" in m]
    assert len(val) == 4 and val[-1]["val_loss"] < val[0]["val_loss"] - 0.5
    first_train = next(m["loss"] for _, m in logs if "loss" in m)
    assert metrics["loss"] < first_train
    manifest = json.loads((packed / "manifest.json").read_text())
    bpt = manifest["splits"]["valid"]["bytes_per_token"]
    assert metrics["val_perplexity"] == pytest.approx(math.exp(metrics["val_loss"]))
    assert metrics["val_bits_per_byte"] == pytest.approx(metrics["val_loss"] / math.log(2) / bpt)
    # the unigram baseline on exactly the scored targets (every valid block but its first token)
    counts = np.load(packed / "unigram_counts.npy").astype(np.float64)
    logp = np.log((counts + 1) / (counts.sum() + len(counts)))
    data = PretrainingData(packed, "valid", batch_size=8)
    targets = np.concatenate([b.input_ids[:, 1:].reshape(-1).numpy() for b in data.eval_batches()])
    assert metrics["val_unigram_loss"] == pytest.approx(-logp[targets].mean(), rel=1e-9)
    assert metrics["val_unigram_bits_per_byte"] == pytest.approx(metrics["val_unigram_loss"] / math.log(2) / bpt)
    assert metrics["val_loss"] < metrics["val_unigram_loss"] - 0.5  # the context helps
    state = torch.load(out / "best.pt", weights_only=True)
    assert state["train_config"]["objective"] == "clm" and "wte.weight" in state["model"]
    assert state["best_val_loss"] == min(m["val_loss"] for m in val)
    header = (out / "pretrain_val.csv").read_text().splitlines()[0].split(",")
    assert {"val_loss", "val_bits_per_byte", "val_unigram_loss"} <= set(header)


def test_exact_resume_matches_an_uninterrupted_run(packed, tmp_path):
    cfg = clm_cfg(max_steps=8, eval_every=4, checkpoint_every=4, model={**MODEL, "dropout": 0.1})
    full, _ = run(cfg, packed, tmp_path / "full")
    part, _ = run(cfg, packed, tmp_path / "parts", stop_at_step=3)
    assert part["step"] == 3 and not part["completed"]
    resumed, logs = run(cfg, packed, tmp_path / "parts")
    assert logs[0][0] > 3  # continued, did not restart
    assert resumed["model_sha256"] == full["model_sha256"] and resumed["val_loss"] == full["val_loss"]


def test_objective_and_examples_mode_must_agree(packed, tmp_path):
    mlm = make_examples(tmp_path / "mlm", masking="static", train_rows=64, valid_rows=16, rows_per_shard=32)
    with pytest.raises(
        BertraceError,
        match=r"pretrain.objective is 'clm'.*MLM/NSP examples \(examples.mode: "
        r"mlm_nsp\); set examples.mode: causal",
    ):
        run(clm_cfg(max_steps=1), mlm, tmp_path / "a")
    with pytest.raises(
        BertraceError,
        match=r"pretrain.objective is 'mlm_nsp'.*packed causal-LM blocks "
        r"\(examples.mode: causal\).*or set pretrain.objective: clm",
    ):
        run(
            PretrainConfig(
                objective="mlm_nsp",
                embedding_init={"method": "random"},
                model=MODEL,
                batch_size=8,
                max_steps=1,
                snapshot_steps=[],
            ),
            packed,
            tmp_path / "b",
        )


# ----------------------------------------------------------------------------- fine-tuning


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """A tokenizer, a clm pre-training checkpoint (random GPT weights) and a synthetic task."""
    root = tmp_path_factory.mktemp("ft")
    tok_path = train_tokenizer(root / "tokenizer.json", [])
    tok = load_tokenizer(tok_path)
    torch.manual_seed(1234)
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        max_position=64,
    )
    provenance = {"stage": "pretrain", "params": {"objective": "clm"}, "tokenizer_sha256": sha256_file(tok_path)}
    ckpt_path = save_checkpoint(
        root / "best.pt",
        {
            "model": GPT(config).state_dict(),
            "model_config": config.to_dict(),
            "train_config": {"objective": "clm"},
            "step": 0,
            "provenance": provenance,
        },
    )
    train = write_csv(root / "train.csv", ["text", "label"], synthetic_rows(200, 1))
    valid = write_csv(root / "valid.csv", ["text", "label"], synthetic_rows(100, 2))
    spec = {
        "source": "local",
        "local": {"train": str(train), "validation": str(valid)},
        "text_columns": ["text"],
        "label_column": "label",
        "label_names": ["neg", "pos"],
    }
    return {
        "root": root,
        "tok_path": tok_path,
        "data": load_task_data(spec, tok, max_len=32),
        "ckpt": load_pretrained(ckpt_path),
    }


def test_a_causal_checkpoint_builds_the_gpt_classifier_in_every_mode(task):
    ckpt = task["ckpt"]
    full = build_model(ckpt, 2, "full", seed=0)
    assert isinstance(full, GPTForSequenceClassification)
    assert all(torch.equal(v, ckpt["model"][k]) for k, v in full.gpt.state_dict().items())
    frozen = build_model(ckpt, 2, "frozen", seed=0)
    assert not any(p.requires_grad for p in frozen.gpt.parameters()) and frozen.score.weight.requires_grad
    scratch = build_model(ckpt, 2, "scratch", seed=0)
    assert not torch.equal(scratch.gpt.wte.weight, ckpt["model"]["wte.weight"])
    with pytest.raises(BertraceError, match="sequence tasks only"):
        build_model(ckpt, 3, "full", task_type="token_classification")


def test_fine_tune_frozen_and_full_then_classify_with_the_saved_model(task):
    ckpt, data = task["ckpt"], task["data"]
    frozen = train_seed(
        ckpt,
        data,
        FinetuneConfig(mode="frozen", epochs=1, batch_size=32, lr=1e-2, seeds=[0], patience=0),
        0,
        progress=False,
    )
    assert all(torch.equal(frozen.state_dict[f"gpt.{k}"], v) for k, v in ckpt["model"].items())  # decoder untouched
    cfg = FinetuneConfig(epochs=3, batch_size=16, lr=2e-3, seeds=[0], patience=0)
    result = train_seed(ckpt, data, cfg, 0, progress=False)
    assert result.validation_accuracy > 0.8  # 'good' vs 'bad' anywhere in the text: last-token pooling learns it
    path = save_finetuned(
        task["root"] / "model.pt",
        state_dict=result.state_dict,
        model_config=ckpt["model_config"],
        label_names=data.label_names,
        task=data.task_info(),
        tokenizer_sha256=sha256_file(task["tok_path"]),
        mode="full",
        seed=0,
        metrics={},
        provenance={},
        architecture="gpt",
    )
    clf = Classifier.load(path)
    assert isinstance(clf.model, GPTForSequenceClassification)
    preds = clf.predict(["the movie was good very good", "the film was bad quite bad"])
    assert [p["label"] for p in preds] == ["pos", "neg"]
    # padding does not change a row's logits (last-token pooling reads the last real token)
    ids, types = clf.encode(["good", "the movie was very good and the plot was good"])
    together = clf.logits_from_ids(ids, types, batch_size=2)
    alone = np.concatenate([clf.logits_from_ids([i], [t]) for i, t in zip(ids, types)])
    assert np.allclose(together, alone, atol=1e-5)


DDP_WORKER = r"""
import json, sys
from pathlib import Path
import torch.distributed as dist
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.loop import pretrain
dist.init_process_group("gloo")
examples, out, model = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
cfg = PretrainConfig(objective="clm", embedding_init={"method": "random"}, model=model, batch_size=8, lr=3e-3, warmup=2, max_steps=6, eval_every=3,
                     eval_batches=0, log_every=1, checkpoint_every=3, snapshot_steps=[], num_threads=1)
m = pretrain(cfg, examples_dir=examples, out_dir=out / "run", provenance={}, progress=False)
(out / f"report{dist.get_rank()}.json").write_text(json.dumps(m))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_ddp_two_cpu_ranks(packed, tmp_path):
    """clm under torchrun (2 gloo ranks): the same weights on both ranks, all-reduced validation
    metrics (bits per byte and the unigram baseline included) on both, the baseline exactly one process's."""
    script = tmp_path / "worker.py"
    script.write_text(DDP_WORKER)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "TQDM_DISABLE": "1",
        "BERTRACE_NO_MLFLOW": "1",
    }
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(packed),
            str(tmp_path),
            json.dumps(MODEL),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"report{r}.json").read_text()) for r in (0, 1))
    assert r0["model_sha256"] == r1["model_sha256"] and r0["world_size"] == 2 and r0["step"] == 6
    assert r0["val_loss"] == r1["val_loss"] and r0["val_unigram_loss"] == r1["val_unigram_loss"]
    cfg = clm_cfg(max_steps=6, eval_every=3, log_every=1, checkpoint_every=3)
    single, _ = run(cfg, packed, tmp_path / "single")
    assert single["val_unigram_loss"] == pytest.approx(r0["val_unigram_loss"], rel=1e-12)  # the same targets
    # each rank reads its own slice of the epoch, so the batches differ from one process's: close, not equal
    assert single["val_loss"] == pytest.approx(r0["val_loss"], rel=0.02)


# ----------------------------------------------------------------------------- the DAG


def test_the_gpt_profile_is_the_default_budget_with_the_causal_objective():
    """profiles/gpt.yaml changes only what makes the DAG causal: same corpus, tokenizer, model size,
    updates, batch and fine-tuning as the encoder's default, so the two compare at the same budget."""
    from pipeline.reports.profiles import apply_overrides, flatten_overrides, load_profile

    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    flat = flatten_overrides(load_profile("gpt", REPO / "profiles"), params)
    assert flat["examples.mode"] == "causal" and flat["pretrain.objective"] == "clm"
    assert flat["download.hub.dataset"] == "Salesforce/wikitext"  # pinned to the corpus its row was measured on
    merged = apply_overrides(params, flat)
    assert ExamplesConfig.from_params(merged["examples"]).mode == "causal"
    cfg = PretrainConfig.from_params(merged["pretrain"])
    assert cfg.objective == "clm" and cfg.max_steps == 2000 and cfg.embedding_init.method == "random"
    assert cfg.model == PretrainConfig().model and cfg.batch_size == PretrainConfig().batch_size


@pytest.mark.slow
def test_the_causal_dag_runs_end_to_end_under_dvc(tmp_path):
    """`dvc repro` of every stage with the gpt profile's params on a slice of WikiText-2 (tiny model)."""
    from pipeline.reports.profiles import apply_overrides, flatten_overrides, load_profile
    from tests.support.repos import copy_repo, run_cmd, tiny_finetune, tiny_pretrain

    root = tmp_path / "repo"
    copy_repo(root)
    shared_file("sst2", "train.tsv")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params = apply_overrides(params, flatten_overrides(load_profile("gpt", REPO / "profiles"), params))
    assert params["examples"]["mode"] == "causal" and params["pretrain"]["objective"] == "clm"
    params["download"].update(source="local")
    params["download"]["local"]["path"] = "data/sources/wiki.raw"
    params["tokenizer"]["vocab_size"] = 2000
    params["examples"].update(docs_per_shard=8, max_seq_len=64, workers=2)
    params["pretrain"] = {**tiny_pretrain(params["pretrain"]), "objective": "clm"}
    params["finetune"] = tiny_finetune(params["finetune"])
    params["finetune_variants"] = {}  # the frozen / scratch stages: tests/e2e/test_dvc_pipeline.py
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(root),
        "BERTRACE_HUB_MIRROR": str(REPO / "mirrors" / "shared-data.yaml"),
        "TQDM_DISABLE": "1",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    run_cmd(["git", "init", "-q"], root)
    run_cmd(["git", "add", "-A"], root)
    run_cmd(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"], root)
    out = run_cmd(["dvc", "repro"], root, env)
    assert "Running stage 'scorecard'" in out.stdout + out.stderr
    manifest = json.loads((root / "data" / "examples" / "manifest.json").read_text())
    assert manifest["mode"] == "causal" and manifest["max_seq_len"] == 64
    validated = json.loads((root / "metrics" / "validate.json").read_text())
    assert validated["failed"] == 0 and validated["passed"] > 0
    pre = json.loads((root / "metrics" / "pretrain.json").read_text())
    assert {"val_loss", "bits_per_byte", "unigram_bits_per_byte", "next_token_acc"} <= set(pre)
    details = json.loads((root / "reports" / "pretrain.json").read_text())  # every number
    assert details["step"] == 6 and details["val_bits_per_byte"] == pre["bits_per_byte"] > 0
    ft = torch.load(root / "data" / "finetune" / "model.pt", weights_only=True)
    assert ft["architecture"] == "gpt" and "gpt.wte.weight" in ft["model"]
    assert json.loads((root / "metrics" / "eval.json").read_text())
    rerun = subprocess.run(["dvc", "status"], cwd=root, env=env, capture_output=True, text=True)
    assert "changed" not in rerun.stdout
