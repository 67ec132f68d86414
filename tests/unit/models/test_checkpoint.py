"""pipeline.models.checkpoint: bytes-stable writes, the readers' errors, upgrade() of the older layouts, kinds."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.models import checkpoint as ck


def weights(seed: int = 0, prefix: str = "") -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {f"{prefix}{k}": v for k, v in torch.nn.Linear(3, 2).state_dict().items()}


def pretraining_state(**extra) -> dict:
    return {
        "model": weights(),
        "model_config": {"hidden_size": 3},
        "train_config": {"objective": "mlm", "max_steps": 5},
        "step": 5,
        "provenance": {"tokenizer_sha256": "a" * 64, "examples_manifest_sha256": "b" * 64},
        **extra,
    }


def finetuned_kwargs(**extra) -> dict:
    return {
        "state_dict": weights(1),
        "model_config": {"hidden_size": 3},
        "label_names": ["neg", "pos"],
        "task": {"type": "classification", "text_columns": ["text"], "max_len": 8, "truncation": "head"},
        "tokenizer_sha256": "c" * 64,
        "mode": "full",
        "seed": 1,
        "metrics": {"validation_accuracy": 0.5},
        "provenance": {"stage": "finetune"},
        **extra,
    }


def old_layout(path, ckpt: dict):
    """A file as older code wrote it: a plain torch.save of ``ckpt``."""
    torch.save(ckpt, path)
    return path


# ----------------------------------------------------------------------------- round trip


def test_a_pretraining_checkpoint_round_trips_to_the_same_bytes(tmp_path):
    a = ck.save_checkpoint(tmp_path / "a" / ck.LAST, pretraining_state())
    b = ck.save_checkpoint(tmp_path / "b.pt", pretraining_state())
    assert a.read_bytes() == b.read_bytes()  # no trace of the file name or the temporary
    state = ck.load_checkpoint(a)
    assert list(state)[:2] == ["format", "version"] and state["format"] == ck.FORMAT
    assert torch.equal(state["model"]["weight"], weights()["weight"])
    # a current checkpoint comes out of upgrade() as it went in: written again, the same bytes
    again = ck.save_checkpoint(
        tmp_path / "again.pt", {k: v for k, v in state.items() if k not in ("format", "version")}
    )
    assert again.read_bytes() == a.read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [ck.LAST]  # no temporary left


def test_a_finetuned_checkpoint_round_trips_to_the_same_bytes(tmp_path):
    a = ck.save_finetuned(tmp_path / "a.pt", **finetuned_kwargs())
    b = ck.save_finetuned(tmp_path / "b.pt", **finetuned_kwargs())
    assert a.read_bytes() == b.read_bytes()
    ckpt = ck.load_finetuned(a)
    assert list(ckpt) == [
        "format", "version", "model", "model_config", "architecture", "num_labels", "label_names", "task",
        "tokenizer_sha256", "mode", "seed", "metrics", "provenance",
    ]  # fmt: skip
    assert ckpt["format"] == ck.FINETUNE_FORMAT and ckpt["num_labels"] == 2 and ckpt["architecture"] == "bert"
    raw = torch.load(a, weights_only=True)
    assert ck.upgrade(copy.deepcopy(raw)).keys() == raw.keys() and ckpt["task"] == raw["task"]


# ----------------------------------------------------------------------------- upgrade


def test_upgrade_strips_compile_and_ddp_prefixes(tmp_path):
    state = {"format": ck.FORMAT, "version": ck.VERSION, **pretraining_state()}
    path = old_layout(tmp_path / "old.pt", {**state, "model": weights(prefix="module._orig_mod.")})
    for read in (ck.read_checkpoint, ck.load_checkpoint):
        assert sorted(read(path)["model"]) == ["bias", "weight"]
    model = torch.nn.Linear(3, 2)
    ck.load_weights(model, ck.read_checkpoint(path)["model"], path)
    assert torch.equal(model.weight, weights()["weight"])


def test_upgrade_gives_an_old_finetuned_checkpoint_its_architecture_and_task_type(tmp_path):
    current = ck.load_finetuned(ck.save_finetuned(tmp_path / "new.pt", **finetuned_kwargs()))
    raw = torch.load(tmp_path / "new.pt", weights_only=True)
    del raw["architecture"]  # before GPT fine-tuning
    del raw["task"]["type"]  # before token classification and regression
    upgraded = ck.load_finetuned(old_layout(tmp_path / "old.pt", raw))
    assert upgraded["architecture"] == "bert" and upgraded["task"] == current["task"]
    assert not ck.is_causal_checkpoint(upgraded) and ck.architecture(upgraded) == "bert"


@pytest.mark.parametrize(
    "train_config, params, objective",
    [
        ({"max_steps": 5}, {"objective": "clm"}, "clm"),  # train_config before objectives: the params say
        ({"max_steps": 5}, {}, "mlm_nsp"),  # neither: BERT's
        (None, {}, "mlm_nsp"),
        ({"objective": "electra"}, {"objective": "clm"}, "electra"),  # current: train_config wins
    ],
)
def test_upgrade_gives_a_pretraining_checkpoint_its_objective(tmp_path, train_config, params, objective):
    state = {**pretraining_state(), "provenance": {"params": params}}
    del state["train_config"]
    if train_config is not None:
        state["train_config"] = train_config
    ckpt = ck.load_checkpoint(ck.save_checkpoint(tmp_path / "last.pt", state))
    assert ckpt["train_config"] == {**(train_config or {}), "objective": objective}
    assert ck.checkpoint_objective(ckpt) == objective
    assert ck.is_causal_checkpoint(ckpt) == (objective == "clm") and ck.architecture(ckpt) == (
        "gpt" if objective == "clm" else "bert"
    )


def test_upgrade_leaves_a_current_checkpoint_as_it_is():
    finetuned = {"model": weights(), "architecture": "gpt", "num_labels": 2, "task": finetuned_kwargs()["task"]}
    for ckpt in (pretraining_state(), finetuned):
        kept = copy.deepcopy(ckpt)
        upgraded = ck.upgrade(kept)
        assert upgraded is kept and list(upgraded) == list(ckpt) and upgraded["model"] is kept["model"]
        assert {k: v for k, v in upgraded.items() if k != "model"} == {k: v for k, v in ckpt.items() if k != "model"}


# ----------------------------------------------------------------------------- kinds


def test_kinds_of_checkpoints(tmp_path):
    pre = ck.load_pretrained(ck.save_checkpoint(tmp_path / "pre.pt", pretraining_state()))
    assert not ck.is_finetuned(pre) and ck.checkpoint_objective(pre) == "mlm"
    gpt = ck.read_checkpoint(ck.save_finetuned(tmp_path / "gpt.pt", **finetuned_kwargs(architecture="gpt")))
    assert ck.is_finetuned(gpt) and ck.is_causal_checkpoint(gpt) and ck.architecture(gpt) == "gpt"
    imported = {"format": "bertrace-imported-checkpoint", "model": {}, "model_config": {}, "provenance": {}}
    assert ck.checkpoint_objective(imported) == "mlm_nsp" and ck.architecture(imported) == "bert"
    assert ck.is_causal_state_dict({"wte.weight": 0}) and ck.is_causal_state_dict({"gpt.wte.weight": 0})
    assert not ck.is_causal_state_dict({"bert.embeddings.word.weight": 0})


def test_kind_errors(tmp_path):
    pre = ck.save_checkpoint(tmp_path / "pre.pt", pretraining_state())
    with pytest.raises(BertraceError, match=re.escape("pre.pt: a pre-training checkpoint (missing ['num_labels',")):
        ck.load_finetuned(pre)
    incomplete = torch.load(ck.save_finetuned(tmp_path / "ft.pt", **finetuned_kwargs()), weights_only=True)
    del incomplete["label_names"]
    with pytest.raises(BertraceError, match=re.escape("an incomplete fine-tuned checkpoint (missing ['label_names'])")):
        ck.load_finetuned(old_layout(tmp_path / "incomplete.pt", incomplete))
    with pytest.raises(BertraceError, match="not a bertrace pre-training checkpoint"):
        ck.load_checkpoint(tmp_path / "ft.pt")
    old_layout(tmp_path / "v0.pt", {"format": ck.FORMAT, "version": 0})
    with pytest.raises(BertraceError, match="checkpoint version 0, this code reads 1; re-run pre-training"):
        ck.load_checkpoint(tmp_path / "v0.pt")
    with pytest.raises(BertraceError, match=re.escape("lacks ['model', 'model_config']; rerun the pretrain stage")):
        ck.load_pretrained(ck.save_checkpoint(tmp_path / "lean.pt", {"step": 1}))
    with pytest.raises(BertraceError, match="not a bertrace checkpoint \\(expected a dict with 'model'"):
        ck.read_checkpoint(old_layout(tmp_path / "list.pt", [1, 2]))


def test_missing_and_corrupt_files_are_one_line_errors(tmp_path):
    with pytest.raises(BertraceError, match="nope.pt: checkpoint not found; check the path"):
        ck.read_checkpoint(tmp_path / "nope.pt")
    with pytest.raises(BertraceError, match=r"nope.pt: checkpoint not found; run the pretrain stage first"):
        ck.load_checkpoint(tmp_path / "nope.pt")
    good = ck.save_checkpoint(tmp_path / "good.pt", pretraining_state()).read_bytes()
    (tmp_path / "cut.pt").write_bytes(good[: len(good) // 2])
    (tmp_path / "text.pt").write_text("not a checkpoint\n")
    for name in ("cut.pt", "text.pt"):
        with pytest.raises(BertraceError) as e:
            ck.load_checkpoint(tmp_path / name)
        assert "\n" not in str(e.value)
        assert re.fullmatch(
            rf".*{name}: not a readable checkpoint \(corrupt, truncated or not a torch file: .+\); delete it "
            r"\(and start pre-training over\) or restore it from a backup / `dvc checkout`",
            str(e.value),
        )
        with pytest.raises(BertraceError) as e:
            ck.read_checkpoint(tmp_path / name)
        assert "\n" not in str(e.value)
        assert re.fullmatch(
            rf".*{name}: not a readable checkpoint \(.+\); rerun the stage that wrote it or restore it with "
            r"`dvc checkout`",
            str(e.value),
        )


def test_resolve_checkpoint_falls_back_to_last(tmp_path):
    with pytest.raises(BertraceError, match=r"best.pt: pre-training checkpoint not found \(nor .*last.pt\)"):
        ck.resolve_checkpoint(tmp_path / ck.BEST)
    last = ck.save_checkpoint(tmp_path / ck.LAST, pretraining_state())
    assert ck.resolve_checkpoint(tmp_path / ck.BEST) == last == ck.resolve_checkpoint(last)


# ----------------------------------------------------------------------------- weights, tokenizer, data


def test_load_weights_and_tokenizer_checks(tmp_path):
    path = ck.save_checkpoint(tmp_path / "pre.pt", pretraining_state())
    with pytest.raises(BertraceError, match=r"pre.pt: weights do not fit its model_config \(Error"):
        ck.load_weights(torch.nn.Linear(4, 2), ck.read_checkpoint(path)["model"], path)
    tok = tmp_path / "tokenizer.json"
    with pytest.raises(BertraceError, match="tokenizer.json: tokenizer not found; the fine-tuned checkpoint"):
        ck.check_tokenizer_hash(tok, None, path)
    tok.write_text("{}")
    assert ck.check_tokenizer_hash(tok, None, path) == sha256_file(tok)
    with pytest.raises(BertraceError, match=f"sha256 {sha256_file(tok)} is not the tokenizer .*pre.pt was trained"):
        ck.check_tokenizer_hash(tok, "0" * 64, path)
    ckpt = ck.read_checkpoint(path)
    with pytest.raises(BertraceError, match="tokenizer mismatch: .*pre.pt was pre-trained with tokenizer sha256 a"):
        ck.check_checkpoint_tokenizer(ckpt, path, tok)
    ckpt["provenance"]["tokenizer_sha256"] = sha256_file(tok)
    assert ck.check_checkpoint_tokenizer(ckpt, path, tok) == sha256_file(tok)
    with pytest.raises(BertraceError, match="records no tokenizer_sha256 in its provenance"):
        ck.check_checkpoint_tokenizer({"provenance": {}}, path, tok)
    ck.check_data_matches(ckpt, path, tokenizer_sha256=sha256_file(tok), manifest_sha256="b" * 64)
    with pytest.raises(BertraceError, match="was trained on different data: examples manifest sha256 b+ in the"):
        ck.check_data_matches(ckpt, path, tokenizer_sha256=sha256_file(tok), manifest_sha256="c" * 64)


def test_remove_stale_temporaries(tmp_path):
    (tmp_path / f".{ck.LAST}.x1.tmp").write_text("")
    (tmp_path / f".{ck.BEST}.x2.tmp").write_text("")
    (tmp_path / ".other.x3.tmp").write_text("")
    assert ck.remove_stale_temporaries(tmp_path) == 2 and ck.remove_stale_temporaries(tmp_path / "none") == 0
    assert [p.name for p in tmp_path.iterdir()] == [".other.x3.tmp"]
