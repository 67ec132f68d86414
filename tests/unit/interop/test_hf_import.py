"""Published checkpoints in: a Hugging Face model directory saved here with
``transformers`` is imported (weights, tokenizer, provenance), computes what ``transformers``
computes (1e-5), fine-tunes through the finetune stage, and traces back to its files; an
architecture we cannot map names its keys."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.core.errors import BertraceError
from pipeline.core.formats import SPECIAL_TOKENS
from pipeline.interop.hf_import import import_checkpoint, is_hf_source, parse_source, write_tokenizer
from pipeline.models.bert import BertConfig, BertForPreTraining

FILLER = "the a movie film story plot actor scene was is very quite rather this that".split()
WORDS = FILLER + ["good", "bad", "great", "awful", "café", "naïve", "running", "played"]
PIECES = ["##s", "##ed", "##ing", "##ly", "##e", "##a", ".", ",", "!"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


def vocab(google_order: bool) -> list[str]:
    """A tiny BERT vocabulary: ours ([PAD] [UNK] [CLS] [SEP] [MASK] first) or Google's layout
    ([PAD], [unused0..2], then [UNK] [CLS] [SEP] [MASK])."""
    words = sorted({w for w in WORDS if "é" not in w and "ï" not in w}) + ["cafe", "naive"] + PIECES
    words += [c for c in "abcdefghijklmnopqrstuvwxyz" if c not in words]
    if google_order:
        return ["[PAD]", "[unused0]", "[unused1]", "[unused2]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    return list(SPECIAL_TOKENS) + words


def save_hf_bert(
    directory: Path,
    *,
    google_order: bool = False,
    cls: str = "BertForPreTraining",
    seed: int = 0,
    lower: bool = True,
    vocab_size: int | None = None,
) -> Path:
    """A random ``transformers`` BERT (2 layers, hidden 64) + vocab.txt + tokenizer_config.json in ``directory``
    (``vocab_size``: the vocabulary filled up with [unusedN] tokens)."""
    import transformers

    tokens = vocab(google_order)
    tokens += [f"[unused{i}]" for i in range(10, 10 + (vocab_size or 0) - len(tokens))]
    config = transformers.BertConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_act="gelu",
    )
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(config).eval()
    with torch.no_grad():  # LayerNorms away from 1/0 and a non-zero output bias: a wrong map shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(directory)
    (directory / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {"do_lower_case": lower, "tokenizer_class": "BertTokenizer", "unk_token": "[UNK]", "pad_token": "[PAD]"}
        ),
        encoding="utf-8",
    )
    return directory


def hf_tokenizer(directory: Path):
    import transformers

    return transformers.BertTokenizer(str(directory / "vocab.txt"), do_lower_case=True)


def batch(texts: list[str], directory: Path):
    enc = hf_tokenizer(directory)(texts, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]


TEXTS = ["The movie was very GOOD!", "a naïve actor played badly, rather awful", "café story"]


@pytest.mark.parametrize("google_order", [False, True], ids=["our-special-ids", "google-special-ids"])
def test_imported_model_computes_what_transformers_computes(tmp_path, google_order):
    import transformers

    d = save_hf_bert(tmp_path / "bert", google_order=google_order)
    ckpt = import_checkpoint(d)
    assert ckpt["provenance"]["stage"] == "imported" and ckpt["provenance"]["model_type"] == "bert"
    config = BertConfig.from_dict(ckpt["model_config"])
    assert (config.num_layers, config.hidden_size, config.num_heads, config.gelu) == (2, 64, 2, "exact")
    ours = BertForPreTraining(config).eval()
    ours.load_state_dict(ckpt["model"])
    theirs = transformers.BertForPreTraining.from_pretrained(d).eval()

    ids, types, mask = batch(TEXTS, d)
    tok = __import__("tokenizers").Tokenizer.from_str(ckpt["tokenizer_json"])
    # our converted tokenizer gives the same tokens as transformers' BertTokenizer, ids remapped
    perm_vocab = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    hf_vocab = vocab(google_order)
    ours_ids = [tok.encode(t).ids for t in TEXTS]
    hf_ids = [[hf_vocab.index(perm_vocab[i]) for i in row] for row in ours_ids]
    assert hf_ids == [[i for i, m in zip(r, k) if m] for r, k in zip(ids.tolist(), mask.tolist())]
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert ckpt["provenance"]["tokenizer"]["special_ids_moved"] == (
        {"[UNK]": [4, 1], "[CLS]": [5, 2], "[SEP]": [6, 3], "[MASK]": [7, 4]} if google_order else {}
    )

    our_ids = torch.tensor([[perm_vocab.index(hf_vocab[i]) for i in row] for row in ids.tolist()])
    with torch.no_grad():
        out = ours(our_ids, types, mask)
        ref = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask)
        x, pooled = ours.bert(our_ids, types, mask)
        ref_enc = theirs.bert(input_ids=ids, token_type_ids=types, attention_mask=mask)
    keep = mask.bool()
    to_ours = torch.tensor([hf_vocab.index(t) for t in perm_vocab])  # our id -> their id
    torch.testing.assert_close(x[keep], ref_enc.last_hidden_state[keep], atol=1e-5, rtol=0)
    torch.testing.assert_close(pooled, ref_enc.pooler_output, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.mlm_logits[keep], ref.prediction_logits[..., to_ours][keep], atol=1e-5, rtol=0)
    torch.testing.assert_close(out.nsp_logits, ref.seq_relationship_logits, atol=1e-5, rtol=0)
    assert (out.mlm_logits[keep] - ref.prediction_logits[..., to_ours][keep]).abs().max() < 1e-5


def test_provenance_hashes_every_file_read_and_the_tokenizer(tmp_path):
    import hashlib

    d = save_hf_bert(tmp_path / "bert")
    (d / "README.md").write_text("not read\n")
    ckpt = import_checkpoint(d)
    prov = ckpt["provenance"]
    assert set(prov["inputs"]) == {
        (d / f).as_posix() for f in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json")
    }
    for path, digest in prov["inputs"].items():
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == digest
    assert prov["source"] == d.as_posix() and prov["resolved_revision"] is None and prov["kind"] == "directory"
    assert prov["tokenizer"]["lowercase"] is True and prov["tokenizer"]["from"] == "vocab.txt"
    out = tmp_path / "tok" / "tokenizer.json"
    assert write_tokenizer(ckpt, out) == prov["tokenizer_sha256"]
    from pipeline.data.tokenizer import load_tokenizer

    tok = load_tokenizer(out)  # our loader accepts it (special ids checked)
    assert tok.encode("Café").tokens == ["[CLS]", "cafe", "[SEP]"]  # uncased: accents stripped
    assert prov["weights"] == {"initialized": [], "dropped": []}


def test_tokenizer_json_only_and_cased(tmp_path):
    """A directory with only tokenizer.json (a fast tokenizer save), cased: casing comes from its normaliser."""
    import transformers

    d = save_hf_bert(tmp_path / "bert", lower=False)
    fast = transformers.BertTokenizerFast(str(d / "vocab.txt"), do_lower_case=False)
    (d / "vocab.txt").unlink()
    (d / "tokenizer_config.json").unlink()
    fast.backend_tokenizer.save(str(d / "tokenizer.json"))
    ckpt = import_checkpoint(d)
    assert ckpt["provenance"]["tokenizer"]["from"] == "tokenizer.json"
    assert ckpt["provenance"]["tokenizer"]["lowercase"] is False
    tok = __import__("tokenizers").Tokenizer.from_str(ckpt["tokenizer_json"])
    for text in TEXTS + ["the movie"]:
        assert tok.encode(text).tokens[1:-1] == fast.tokenize(text)
    assert tok.encode("The movie").tokens == ["[CLS]", "[UNK]", "movie", "[SEP]"]  # cased: "The" is not "the"


def test_bare_bert_model_and_masked_lm_saves_get_fresh_heads(tmp_path):
    import transformers

    for cls, initialized in (("BertModel", {"cls."}), ("BertForMaskedLM", {"bert.pooler.", "cls.seq_relationship."})):
        d = save_hf_bert(tmp_path / cls, cls=cls)
        ckpt = import_checkpoint(d)
        got = ckpt["provenance"]["weights"]["initialized"]
        assert got and all(k.startswith(tuple(initialized)) for k in got), got
        ref = getattr(transformers, cls).from_pretrained(d).eval()
        ours = BertForPreTraining(BertConfig.from_dict(ckpt["model_config"])).eval()
        ours.load_state_dict(ckpt["model"])
        ids, types, mask = batch(TEXTS, d)
        with torch.no_grad():
            x, _ = ours.bert(ids, types, mask)
            h = (
                ref(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
                if cls == "BertModel"
                else ref.bert(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
            )
        torch.testing.assert_close(x[mask.bool()], h[mask.bool()], atol=1e-5, rtol=0)


def test_unmappable_architectures_name_the_keys(tmp_path):
    import transformers

    gpt = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=60, n_positions=32)
    ).save_pretrained(gpt)
    with pytest.raises(BertraceError, match=r"model_type 'gpt2' .*GPT2LMHeadModel.*supported: \['bert'"):
        import_checkpoint(gpt)

    d = save_hf_bert(tmp_path / "extra")
    from safetensors.torch import load_file, save_file

    sd = load_file(d / "model.safetensors")
    sd["bert.encoder.layer.0.attention.self.relative_bias"] = torch.zeros(4)
    del sd["bert.encoder.layer.1.output.dense.weight"]
    save_file(sd, d / "model.safetensors")
    with pytest.raises(BertraceError) as e:
        import_checkpoint(d)
    msg = str(e.value)
    assert "bert checkpoint" in msg and "missing 1 keys ['bert.encoder.layer.1.output.dense.weight']" in msg
    assert "unexpected 1 keys ['bert.encoder.layer.0.attention.self.relative_bias']" in msg

    cfg = json.loads((d / "config.json").read_text())
    cfg["position_embedding_type"] = "relative_key"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BertraceError, match="relative_key"):
        import_checkpoint(d)


def test_sources_pointer_files_and_the_offline_hub(tmp_path, monkeypatch):
    d = save_hf_bert(tmp_path / "bert")
    assert is_hf_source(d) and is_hf_source("hf:google/bert_uncased_L-2_H-128_A-2@main")
    assert not is_hf_source("data/pretrain/best.pt")
    pointer = tmp_path / "bert-tiny.yaml"
    pointer.write_text("hub: google/bert_uncased_L-2_H-128_A-2\nrevision: v1\n")
    assert parse_source(pointer)["repo_id"] == "google/bert_uncased_L-2_H-128_A-2"
    assert parse_source("hf:org/name")["revision"] == "main"
    bad = tmp_path / "bad.yaml"
    bad.write_text("hub: x/y\nbranch: main\n")
    with pytest.raises(BertraceError, match="exactly `hub: <org/name>`"):
        parse_source(bad)
    bad.write_text("hub: x/y\nrevision: 1234567\n")  # a short sha of digits: YAML reads a number
    with pytest.raises(BertraceError, match=r'revision 1234567 is not a string; quote it \(revision: "1234567"\)'):
        parse_source(bad)
    with pytest.raises(BertraceError, match="not a hub model id"):
        parse_source("hf:not a/valid id")

    # offline: the error names the id and revision and the local-directory way round
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with pytest.raises(BertraceError, match=r"google/bert_uncased_L-2_H-128_A-2@v1: download failed.*--local-dir DIR"):
        import_checkpoint(pointer)

    # a snapshot (as snapshot_download returns it: .../snapshots/<commit>) records the commit
    sha = "0123456789abcdef0123456789abcdef01234567"
    snap = tmp_path / "cache" / "snapshots" / sha
    snap.parent.mkdir(parents=True)
    d.rename(snap)
    import huggingface_hub

    calls = []
    monkeypatch.setattr(
        huggingface_hub,
        "snapshot_download",
        lambda repo_id, revision, allow_patterns: calls.append((repo_id, revision)) or str(snap),
    )
    ckpt = import_checkpoint(pointer)
    prov = ckpt["provenance"]
    assert calls == [("google/bert_uncased_L-2_H-128_A-2", "v1")]
    assert (prov["source"], prov["revision"], prov["resolved_revision"]) == (
        "hf:google/bert_uncased_L-2_H-128_A-2",
        "v1",
        sha,
    )
    assert prov["inputs"][pointer.as_posix()]  # the pointer file is an input too
    from pipeline.interop.hf_import import describe

    assert describe(prov) == f"imported from hf:google/bert_uncased_L-2_H-128_A-2@{sha}"


# ---------------------------------------------------------------------------------------------
# Through the finetune stage, and traced back
# ---------------------------------------------------------------------------------------------
def synthetic_rows(n: int, seed: int) -> list[tuple[str, int]]:
    """Label 1 iff the sentence holds 'good' (else 'bad'): learnable in a few steps."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = rng.choices(FILLER, k=rng.randint(4, 10))
        words.insert(rng.randrange(len(words) + 1), "good" if i % 2 else "bad")
        rows.append((" ".join(words), i % 2))
    return rows


def write_task(root: Path) -> dict:
    import csv

    files = {}
    for split, n, seed in (("train", 160, 1), ("validation", 60, 2)):
        files[split] = root / f"{split}.csv"
        with open(files[split], "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([("text", "label"), *synthetic_rows(n, seed)])
    return {
        "source": "local",
        "local": {k: str(v) for k, v in files.items()},
        "text_columns": ["text"],
        "label_column": "label",
        "label_names": ["neg", "pos"],
        "splits": {"train": "train", "validation": "validation", "test": None},
    }


def finetune_params(checkpoint: str, tokenizer: str, task: dict) -> dict:
    from pipeline.finetune.loop import FinetuneConfig

    params = FinetuneConfig().model_dump(mode="json")
    params.update(
        checkpoint=checkpoint,
        tokenizer=tokenizer,
        task=task,
        max_len=32,
        epochs=6,
        batch_size=16,
        lr=3e-3,
        seeds=[0],
        patience=0,
        threads=1,
    )
    return params


def test_finetune_stage_imports_trains_and_traces(tmp_path, monkeypatch, capsys):
    import stages.cli.trace as trace_cli
    import stages.finetune as stage
    from pipeline.core.io import sha256_file
    from pipeline.lineage import trace, trace_verify

    hf_dir = save_hf_bert(tmp_path / "published" / "bert", google_order=True)
    root = tmp_path / "repo"
    root.mkdir()
    task = write_task(tmp_path)
    params = finetune_params(hf_dir.as_posix(), "data/tokenizer/tokenizer.json", task)
    (root / "params.yaml").write_text(
        yaml.safe_dump({"compute": {"kernels": "portable"}, "finetune": params}), encoding="utf-8"
    )
    monkeypatch.chdir(root)
    monkeypatch.delenv("BERTRACE_HUB_MIRROR", raising=False)
    with pytest.raises(BertraceError, match=f"set finetune.tokenizer: {hf_dir.as_posix()} too"):
        stage.main(progress=False)  # the pipeline's tokenizer cannot go with a published checkpoint

    params["tokenizer"] = hf_dir.as_posix()
    (root / "params.yaml").write_text(
        yaml.safe_dump({"compute": {"kernels": "portable"}, "finetune": params}), encoding="utf-8"
    )
    stage.main(progress=False)
    ckpt = torch.load(root / "data/finetune/model.pt", weights_only=True)
    tok_sha = sha256_file(root / "data/finetune/tokenizer.json")
    assert ckpt["tokenizer_sha256"] == tok_sha == ckpt["provenance"]["pretrain"]["tokenizer_sha256"]
    assert ckpt["provenance"]["pretrain"]["stage"] == "imported"
    assert ckpt["metrics"]["validation_accuracy"] > 0.8  # learnt the keyword task from the imported encoder
    # the fine-tuned encoder started from the imported weights (moved, but close to them after 20 steps)
    imported = import_checkpoint(hf_dir)["model"]
    start, end = imported["bert.layers.0.ffn.fc.weight"], ckpt["model"]["bert.layers.0.ffn.fc.weight"]
    assert 0 < (end - start).abs().max() < 0.2
    from pipeline.evaluate.inference import Classifier

    clf = Classifier.load(root / "data/finetune/model.pt")  # the written tokenizer goes with the model
    assert [p["label"] for p in clf.predict(["a very good movie", "the bad plot was quite this"])] == ["pos", "neg"]

    # trace: "imported from <dir>" at the root, and --verify rehashes the imported files
    lin = trace.lineage(root / "data/finetune/model.pt")
    assert [n["stage"] for n in lin["chain"]] == ["finetune", "imported"]
    assert lin["chain"][-1]["source"] == f"{hf_dir.as_posix()} (local directory)"
    assert trace_cli.main([str(root / "data/finetune/model.pt"), "--verify", "--root", str(root)]) == 0
    text = capsys.readouterr().out
    assert f"imported from {hf_dir.as_posix()} (local directory)" in text
    assert "0 changed, 0 not present" in text
    checked = {v["path"] for v in trace_verify.verify(lin, root) if v["stage"] == "imported" and v["status"] == "ok"}
    assert {(hf_dir / f).as_posix() for f in ("config.json", "model.safetensors", "vocab.txt")} <= checked

    # editing an imported file is caught
    (hf_dir / "vocab.txt").write_text((hf_dir / "vocab.txt").read_text() + "extra\n")
    with pytest.raises(SystemExit):
        trace_cli.main([str(root / "data/finetune/model.pt"), "--verify", "--root", str(root)])
    assert f"CHANGED {(hf_dir / 'vocab.txt').as_posix()}" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# pretrain.init: continued pre-training
# ---------------------------------------------------------------------------------------------
def _tiny_pretrain(init: str | None, steps: int = 2, lr: float = 1e-3):
    from pipeline.pretrain.config import PretrainConfig

    return PretrainConfig(
        objective="mlm_nsp",
        embedding_init={"method": "random"},
        max_steps=steps,
        batch_size=8,
        eval_every=0,
        eval_batches=1,
        checkpoint_every=None,
        snapshot_steps=[],
        device="cpu",
        num_threads=1,
        lr=lr,
        warmup=0.0,
        init=init,
        model={
            "preset": "tiny",
            "hidden_size": 32,
            "num_heads": 2,
            "intermediate_size": 64,
            "max_position": 64,
            "dropout": 0.0,
        },
    )


def test_pretrain_init_from_a_published_checkpoint(tmp_path):
    from pipeline.pretrain.loop import pretrain
    from stages.pretrain import import_published
    from tests.support.examples_data import VOCAB, make_examples

    hf_dir = save_hf_bert(tmp_path / "bert", google_order=True, vocab_size=VOCAB)
    imported = import_checkpoint(hf_dir)
    examples = make_examples(
        tmp_path / "ex", train_rows=32, valid_rows=8, tokenizer_sha256=imported["provenance"]["tokenizer_sha256"]
    )
    pretrain(
        _tiny_pretrain(hf_dir.as_posix(), lr=1e-9),
        examples_dir=examples,
        out_dir=tmp_path / "out",
        provenance={"stage": "pretrain"},
        progress=False,
        import_init=import_published,  # what the stage passes: pipeline/pretrain knows no Hugging Face
    )
    last = torch.load(tmp_path / "out" / "last.pt", weights_only=True)
    # the architecture is the checkpoint's (hidden 64), not pretrain.model's (32); the weights start from it
    assert last["model_config"]["hidden_size"] == 64 and last["model_config"]["dropout"] == 0.0
    for key in ("bert.embeddings.word.weight", "bert.layers.1.attn.qkv.weight", "nsp.weight"):
        assert (last["model"][key] - imported["model"][key]).abs().max() < 1e-5, key
    prov = last["provenance"]
    assert prov["init"]["imported_from"] == f"imported from {hf_dir.as_posix()} (local directory)"
    assert prov["upstream"]["imported"]["inputs"] == imported["provenance"]["inputs"]
    from pipeline.lineage import trace

    lin = trace.lineage(tmp_path / "out" / "last.pt")
    assert [n["stage"] for n in lin["chain"]] == ["pretrain", "imported"]

    # examples made with another tokenizer: the ids would mean other tokens
    other = make_examples(tmp_path / "ex2", train_rows=32, valid_rows=8)
    with pytest.raises(BertraceError, match="pretrain.init .* another tokenizer"):
        pretrain(
            _tiny_pretrain(hf_dir.as_posix()),
            examples_dir=other,
            out_dir=tmp_path / "out2",
            provenance={},
            progress=False,
            import_init=import_published,
        )
    # without the stage's import, pretrain.init must be our own checkpoint
    with pytest.raises(BertraceError, match="pretrain.init .*bert: not found; give a checkpoint"):
        pretrain(_tiny_pretrain(hf_dir.as_posix()), examples_dir=examples, out_dir=tmp_path / "out3", provenance={})


def test_pretrain_init_from_our_checkpoint(tmp_path):
    from pipeline.pretrain.loop import pretrain
    from tests.support.examples_data import TOKENIZER_SHA, make_examples

    examples = make_examples(tmp_path / "ex", train_rows=32, valid_rows=8)
    pretrain(
        _tiny_pretrain(None, steps=3),
        examples_dir=examples,
        out_dir=tmp_path / "a",
        progress=False,
        provenance={"stage": "pretrain"},
    )
    first = torch.load(tmp_path / "a" / "last.pt", weights_only=True)
    pretrain(
        _tiny_pretrain((tmp_path / "a" / "last.pt").as_posix(), lr=1e-9),
        examples_dir=examples,
        out_dir=tmp_path / "b",
        provenance={"stage": "pretrain"},
        progress=False,
    )
    second = torch.load(tmp_path / "b" / "last.pt", weights_only=True)
    for key in ("bert.layers.0.ffn.fc.weight", "mlm.dense.weight"):  # continued from the first run's weights
        assert (second["model"][key] - first["model"][key]).abs().max() < 1e-6, key
    init = second["provenance"]["init"]
    assert init["tokenizer_sha256"] == TOKENIZER_SHA and init["step"] == 3
    from pipeline.core.io import sha256_file

    assert init["sha256"] == sha256_file(tmp_path / "a" / "last.pt")
    with pytest.raises(BertraceError, match="pretrain.init .*nope.pt: not found"):
        pretrain(
            _tiny_pretrain((tmp_path / "nope.pt").as_posix()),
            examples_dir=examples,
            out_dir=tmp_path / "c",
            provenance={},
            progress=False,
        )


# ---------------------------------------------------------------------------------------------
# dvc repro: finetune -> evaluate with finetune.checkpoint a Hugging Face directory
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_dvc_repro_finetunes_and_evaluates_an_imported_directory(tmp_path):
    """The real finetune and evaluate stages of dvc.yaml (the others left out: an imported encoder
    needs no pre-training; reports/pretrain.json, evaluate's scorecard input, is a stub): the model
    directory is a DVC dependency through ${finetune.checkpoint}, so editing it reruns finetune."""
    import os
    import shutil
    import subprocess
    import sys

    from tests.conftest import REPO

    root = tmp_path / "repo"
    root.mkdir()
    for item in ("pipeline", "stages"):
        shutil.copytree(REPO / item, root / item, ignore=shutil.ignore_patterns("__pycache__"))
    for item in (".gitignore", "pyproject.toml"):
        shutil.copy2(REPO / item, root / item)
    (root / ".dvc").mkdir()
    shutil.copy2(REPO / ".dvc" / "config", root / ".dvc" / "config")
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    dvc["stages"] = {k: v for k, v in dvc["stages"].items() if k in ("finetune", "evaluate")}
    dvc.pop("plots", None)
    (root / "dvc.yaml").write_text(yaml.safe_dump(dvc, sort_keys=False))
    (root / "reports").mkdir()
    (root / "reports" / "pretrain.json").write_text("{}\n")
    save_hf_bert(root / "models" / "bert", google_order=True)
    task = write_task(root)
    task["local"] = {k: Path(v).name for k, v in task["local"].items()}  # relative to the repo
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["finetune"] = finetune_params("models/bert", "models/bert", task)
    params["evaluate"].update(log_model=False)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(root),
        TQDM_DISABLE="1",
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("BERTRACE_HUB_MIRROR", None)

    def run(*cmd):
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{cmd}: {proc.stdout}\n{proc.stderr}"
        return proc.stdout + proc.stderr

    run("git", "init", "-q")
    run("git", "add", "-A")
    run("git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    out = run("dvc", "repro")
    assert "Running stage 'finetune'" in out and "Running stage 'evaluate'" in out
    assert "imported from models/bert (local directory)" in out
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]["finetune"]
    assert "models/bert" in {d["path"] for d in lock["deps"]}  # tracked by DVC (a directory md5)
    evaluation = json.loads((root / "metrics" / "eval.json").read_text())
    assert evaluation  # evaluate scored the imported-and-fine-tuned model
    row = json.loads((root / "reports" / "scorecard.json").read_text())["this_run"]
    assert row["corpus"] == "published: models/bert@local" and row["pretrained"] is False
    assert row["model"] == "2L/64" and row["dev_mean"] > 80
    record = json.loads((root / "data" / "provenance" / "finetune.json").read_text())
    assert record["upstream"]["imported"]["source"] == "models/bert"
    assert "models/bert/vocab.txt" in record["upstream"]["imported"]["inputs"]

    text = run(sys.executable, "-m", "stages.cli", "trace", "data/finetune/model.pt", "--verify")
    assert "imported from models/bert (local directory)" in text and " 0 changed" in text

    assert "Running stage" not in run("dvc", "repro")  # nothing changed: nothing runs
    cfg = json.loads((root / "models" / "bert" / "config.json").read_text())
    (root / "models" / "bert" / "config.json").write_text(json.dumps({**cfg, "hidden_dropout_prob": 0.2}))
    status = run("dvc", "status", "finetune")
    assert "modified:" in status and "models/bert" in status


def test_an_early_google_upload_without_model_type_and_gamma_beta_names(tmp_path):
    """Like google/bert_uncased_L-2_H-128_A-2: config.json without model_type or architectures,
    pytorch_model.bin with TF's LayerNorm gamma/beta names, no tokenizer_config.json (uncased by default)."""
    import transformers
    from safetensors.torch import load_file

    d = save_hf_bert(tmp_path / "bert", google_order=True)
    sd = load_file(d / "model.safetensors")
    torch.save(
        {
            k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
            for k, v in sd.items()
        },
        d / "pytorch_model.bin",
    )
    (d / "model.safetensors").unlink()
    (d / "tokenizer_config.json").unlink()
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(
        json.dumps({k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "transformers_version")})
    )
    ckpt = import_checkpoint(d)
    assert ckpt["provenance"]["model_type"] == "bert" and ckpt["provenance"]["tokenizer"]["lowercase"] is True
    assert ckpt["provenance"]["weights"]["initialized"] == []
    ref = transformers.BertForPreTraining(transformers.BertConfig(**cfg)).eval()
    ref.load_state_dict(sd, strict=False)
    ours = BertForPreTraining(BertConfig.from_dict(ckpt["model_config"])).eval()
    ours.load_state_dict(ckpt["model"])
    ids, types, mask = batch(TEXTS, d)
    tok = __import__("tokenizers").Tokenizer.from_str(ckpt["tokenizer_json"])
    our_ids = torch.tensor([[tok.token_to_id(vocab(True)[i]) for i in row] for row in ids.tolist()])
    with torch.no_grad():
        torch.testing.assert_close(
            ours(our_ids, types, mask).nsp_logits,
            ref(input_ids=ids, token_type_ids=types, attention_mask=mask).seq_relationship_logits,
            atol=1e-5,
            rtol=0,
        )


def test_the_bert_tiny_profile_points_at_the_hub_pointer():
    from pipeline.reports.profiles import load_profile
    from tests.conftest import REPO

    profile = load_profile("bert-tiny-google", REPO / "profiles")
    pointer = REPO / profile["finetune"]["checkpoint"]
    assert profile["finetune"]["tokenizer"] == profile["finetune"]["checkpoint"]
    source = parse_source(pointer)
    assert (source["repo_id"], source["revision"]) == ("google/bert_uncased_L-2_H-128_A-2", "main")


def test_an_electra_discriminator_imports_when_the_objective_exists(tmp_path):
    """transformers' ElectraForPreTraining (embedding_size 32 < hidden 64, Google's special ids):
    our encoder gives its hidden states to 1e-5 (pipeline.interop.hf.electra_state_dict_from_hf, ELECTRA objective)."""
    import transformers

    from pipeline.models.bert import BertModel

    tokens = vocab(True)
    config = transformers.ElectraConfig(
        vocab_size=len(tokens),
        embedding_size=32,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    ref = transformers.ElectraForPreTraining(config).eval()
    d = tmp_path / "electra"
    ref.save_pretrained(d)
    (d / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    ckpt = import_checkpoint(d)
    assert ckpt["provenance"]["model_type"] == "electra"
    cfg = BertConfig.from_dict(ckpt["model_config"])
    assert (cfg.embedding_size, cfg.hidden_size, cfg.pooler_activation) == (32, 64, "gelu")
    ours = BertModel(cfg).eval()
    ours.load_state_dict({k[len("bert.") :]: v for k, v in ckpt["model"].items() if k.startswith("bert.")})
    ids, types, mask = batch(TEXTS, d)
    tok = __import__("tokenizers").Tokenizer.from_str(ckpt["tokenizer_json"])
    our_ids = torch.tensor([[tok.token_to_id(tokens[i]) for i in row] for row in ids.tolist()])
    with torch.no_grad():
        x, _ = ours(our_ids, types, mask)
        h = ref.electra(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(x[mask.bool()], h[mask.bool()], atol=1e-5, rtol=0)
    assert any(k.startswith("disc_head.") for k in ckpt["model"])  # the replaced-token head came along
    from pipeline.finetune.loop import build_model

    clf = build_model(ckpt, 2).eval()  # what the finetune stage builds: ELECTRA's encoder, a fresh head
    torch.testing.assert_close(clf.bert.embeddings.word.weight, ours.embeddings.word.weight, atol=0, rtol=0)

    from safetensors.torch import load_file, save_file

    sd = load_file(d / "model.safetensors")
    sd["electra.encoder.layer.0.extra.weight"] = torch.zeros(2)
    save_file(sd, d / "model.safetensors")
    with pytest.raises(BertraceError, match=r"unexpected 1 keys \['electra.encoder.layer.0.extra.weight'\]"):
        import_checkpoint(d)
