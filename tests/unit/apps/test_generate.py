"""Sampling (pipeline/apps/generate.py, ``bertrace generate``) and the GPT-2 export (pipeline/interop/export_gpt.py).

Checkpoints are built here: a tiny random GPT with random biases and LayerNorms (so its logits
are spread and greedy choices are clear), the tiny WordPiece tokenizer of tests/unit/evaluate/test_evaluate.py,
laid out as the pipeline does (data/pretrain/best.pt, data/tokenizer/tokenizer.json).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.apps.generate import TextStream, generate, generate_text, load_causal_lm, sample_next
from pipeline.core.errors import BertraceError
from pipeline.core.formats import SEP_ID
from pipeline.core.io import sha256_file
from pipeline.data.tokenizer import encode_prompt
from pipeline.models.gpt import GPT, GPTForSequenceClassification
from tests.support.chain import fake_chain, sentences, tiny_config, train_tiny_tokenizer
from tests.support.weights import randomize

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ["the film was", "a gripping , funny story !", "", "don't stop playing"]


def save_causal_checkpoint(
    data: Path,
    *,
    seed: int = 0,
    objective: str = "clm",
    name: str = "best.pt",
    tokenizer: Path | None = None,
    max_position: int = 64,
) -> tuple[Path, GPT]:
    """``data/pretrain/<name>`` (a random GPT, or a BERT for objective 'bert') and
    ``data/tokenizer/tokenizer.json``, as the pipeline lays them out."""
    from tokenizers import Tokenizer

    from pipeline.models.bert import BertForPreTraining
    from pipeline.models.checkpoint import save_checkpoint

    tok_path = data / "tokenizer" / "tokenizer.json"
    if not tok_path.exists():
        if tokenizer is not None:
            tok_path.parent.mkdir(parents=True, exist_ok=True)
            tok_path.write_bytes(tokenizer.read_bytes())
        else:
            train_tiny_tokenizer(tok_path)
    config = tiny_config(Tokenizer.from_file(str(tok_path)).get_vocab_size())
    config.max_position, config.layer_norm_eps = max_position, 1e-5
    torch.manual_seed(seed)
    model = GPT(config) if objective == "clm" else BertForPreTraining(config)
    if objective == "clm":
        randomize(model, seed)
    path = save_checkpoint(
        data / "pretrain" / name,
        {
            "model": model.state_dict(),
            "model_config": config.to_dict(),
            "step": 10,
            "train_config": {"objective": objective},
            "provenance": {"tokenizer_sha256": sha256_file(tok_path), "examples_manifest_sha256": "0" * 64},
        },
    )
    return path, model.eval()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gen") / "data"
    save_causal_checkpoint(d)
    return d


# --------------------------------------------------------------------------------------------
# Next-token choice


def test_sample_next_filters():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.5, 2.9])
    g = torch.Generator().manual_seed(0)
    assert sample_next(logits, 0.0) == 1  # greedy
    assert {sample_next(logits, 1.0, top_k=1, generator=g) for _ in range(20)} == {1}
    assert {sample_next(logits, 5.0, top_k=2, generator=g) for _ in range(200)} == {1, 4}
    # top-p: p(1) ~ 0.40, p(4) ~ 0.36, p(2) ~ 0.15: 0.5 keeps the first two, 0.8 the first three
    assert {sample_next(logits, 1.0, top_p=0.5, generator=g) for _ in range(300)} == {1, 4}
    assert {sample_next(logits, 1.0, top_p=0.8, generator=g) for _ in range(300)} == {1, 2, 4}
    assert {sample_next(logits, 1.0, top_p=0.01, generator=g) for _ in range(20)} == {1}
    # a high temperature flattens: every token is drawn
    assert {sample_next(logits, 100.0, generator=g) for _ in range(300)} == {0, 1, 2, 3, 4}
    # frequencies follow softmax(logits / T)
    draws = torch.tensor([sample_next(logits, 2.0, generator=g) for _ in range(4000)])
    freq = torch.bincount(draws, minlength=5).float() / 4000
    torch.testing.assert_close(freq, torch.softmax(logits / 2.0, -1), atol=0.03, rtol=0)


def test_bad_sampling_settings_are_clear_errors(data):
    model, tok, _ = load_causal_lm(data / "pretrain" / "best.pt")
    for kw, match in (
        ({"temperature": -1}, "--temperature"),
        ({"top_k": -2}, "--top-k"),
        ({"top_p": 0.0}, "--top-p"),
        ({"top_p": 1.5}, "--top-p"),
    ):
        with pytest.raises(BertraceError, match=match):
            generate(model, [SEP_ID], 5, **kw)
    with pytest.raises(BertraceError, match="max_position is 64"):
        generate(model, [SEP_ID] * 64, 5)


# --------------------------------------------------------------------------------------------
# Generation


def test_greedy_equals_transformers_generate_on_the_export(data, tmp_path):
    transformers = pytest.importorskip("transformers")
    from pipeline.interop.export import export_hf

    model, tok, _ = load_causal_lm(data / "pretrain" / "best.pt")
    info = export_hf(data / "pretrain" / "best.pt", tmp_path / "hf")
    assert info["architecture"] == "GPT2LMHeadModel" and info["verification"]["max_abs_logit_diff"] < 1e-5
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    lengths = []
    for prompt in PROMPTS:
        ids = encode_prompt(tok, prompt)
        enc = hf_tok(prompt, return_tensors="pt")
        assert enc["input_ids"][0].tolist() == ids  # [SEP] + the prompt, as ours
        ours = generate(model, ids, 30, temperature=0)
        with torch.no_grad():
            theirs = hf.generate(**enc, do_sample=False, max_new_tokens=30)[0, len(ids) :].tolist()
        assert ours == theirs, prompt
        lengths.append(len(ours))
    assert max(lengths) == 30  # not every continuation ends at once on a separator


def test_same_seed_same_text_and_streaming_in_order(data):
    model, tok, _ = load_causal_lm(data / "pretrain" / "best.pt")
    runs = []
    for seed in (1, 1, 2):
        tokens, pieces = [], []
        ids = encode_prompt(tok, "the film was")
        new = generate(model, ids, 40, temperature=1.0, top_k=50, seed=seed, on_token=tokens.append)
        assert tokens == new  # the callback saw every token, in order, as it was chosen
        sample = generate_text(
            model, tok, "the film was", 40, temperature=1.0, top_k=50, seed=seed, on_text=pieces.append
        )
        assert sample.new_ids == new
        assert "".join(pieces) == sample.text == tok.decode(sample.prompt_ids + sample.new_ids)
        assert sample.text.startswith("the film was")
        runs.append(sample.text)
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_each_new_token_costs_one_position(data):
    model, tok, _ = load_causal_lm(data / "pretrain" / "best.pt")
    widths = []
    hook = model.blocks[0].register_forward_hook(lambda m, args, out: widths.append(args[0].size(1)))
    try:
        new = generate(model, encode_prompt(tok, "the film was"), 12, temperature=0.8, seed=3, stop_ids=())
    finally:
        hook.remove()
    assert len(new) == 12 and widths == [4] + [1] * 11  # the prompt once, then one position a step


def test_generation_stops_at_max_position_and_at_the_separator(data, tmp_path):
    model, tok, _ = load_causal_lm(data / "pretrain" / "best.pt")
    ids = encode_prompt(tok, "the film was")
    assert len(generate(model, ids, 500, temperature=1.0, seed=0, stop_ids=())) == 64 - len(ids)
    # make the separator the likeliest next token everywhere: greedy stops after one
    with torch.no_grad():
        model.wte.weight[SEP_ID] = model.ln_f.weight.sign() * 50
    assert generate(model, ids, 10, temperature=0) == [SEP_ID]


def test_text_stream_never_takes_back_what_it_wrote(data):
    """WordPiece decoding changes the text before the newest token (``##`` joins, ``don ' t`` ->
    ``don't``); the stream writes only what is final, and ends with the full decoding."""
    _, tok, _ = load_causal_lm(data / "pretrain" / "best.pt")
    for text in ["i don't like playing , really !", "the actor's play ... was bad ?", "it 's great , isn't it"]:
        ids = tok.encode(text, add_special_tokens=False).ids
        stream, written = TextStream(tok), ""
        for t in ids:
            piece = stream.push(t)
            written += piece
            assert tok.decode(stream.ids).startswith(written)  # nothing written is ever contradicted
        written += stream.finish()
        assert written == tok.decode(ids)


def test_wrong_checkpoints_are_clear_errors(tmp_path, data):
    bert = tmp_path / "bert" / "data"
    save_causal_checkpoint(bert, objective="bert", tokenizer=data / "tokenizer" / "tokenizer.json")
    with pytest.raises(
        BertraceError,
        match=r"encoder \(masked-LM\) checkpoint \(pretrain.objective: bert\).*"
        r"set pretrain.objective: clm",
    ):
        load_causal_lm(bert / "pretrain" / "best.pt")
    other = train_tiny_tokenizer(tmp_path / "other" / "tokenizer.json", vocab_size=250)
    with pytest.raises(BertraceError, match="is not the tokenizer"):
        load_causal_lm(data / "pretrain" / "best.pt", other)


# --------------------------------------------------------------------------------------------
# CLI


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "stages.cli", "generate", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_streams_the_same_text_as_the_library(data):
    model, tok, _ = load_causal_lm(data / "pretrain" / "best.pt")
    expected = generate_text(model, tok, "the film was", 15, temperature=0.7, top_p=0.9, seed=5).text
    r = _cli(
        "the film was",
        "--max-new-tokens",
        "15",
        "--temperature",
        "0.7",
        "--top-p",
        "0.9",
        "--seed",
        "5",
        cwd=data.parent,
    )  # default checkpoint: data/pretrain/best.pt
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected + "\n"
    assert "new tokens from data/pretrain/best.pt" in r.stderr


def test_cli_falls_back_to_last_pt_and_refuses_an_mlm_checkpoint(tmp_path, data):
    d = tmp_path / "run" / "data"
    save_causal_checkpoint(d, name="last.pt", tokenizer=data / "tokenizer" / "tokenizer.json")
    r = _cli("hello", "-n", "3", "-t", "0", cwd=d.parent)
    assert r.returncode == 0, r.stderr
    assert "from data/pretrain/last.pt" in r.stderr
    bert = tmp_path / "bert" / "data"
    save_causal_checkpoint(bert, objective="bert", tokenizer=data / "tokenizer" / "tokenizer.json")
    r = _cli("hello", cwd=bert.parent)
    assert r.returncode == 2 and "set pretrain.objective: clm" in r.stderr and "Traceback" not in r.stderr
    r = _cli("hello", cwd=tmp_path)
    assert r.returncode == 2 and "neither best.pt nor last.pt" in r.stderr


# --------------------------------------------------------------------------------------------
# Export


def test_export_loads_with_auto_classes_and_matches_logits(data, tmp_path):
    transformers = pytest.importorskip("transformers")
    from pipeline.interop.export import export_hf

    model, tok, _ = load_causal_lm(data / "pretrain" / "best.pt")
    out = tmp_path / "hf"
    info = export_hf(data / "pretrain" / "best.pt", out)
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "bertrace_export.json",
    } <= set(info["files"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert type(hf).__name__ == "GPT2LMHeadModel"
    assert (hf_tok.bos_token, hf_tok.eos_token, hf_tok.pad_token) == ("[SEP]", "[SEP]", "[PAD]")
    texts = sentences(6, 3)
    enc = hf_tok(texts, padding=True, return_tensors="pt")
    assert "token_type_ids" not in enc
    assert [e[m.bool()].tolist() for e, m in zip(enc["input_ids"], enc["attention_mask"])] == [
        encode_prompt(tok, t) for t in texts
    ]
    with torch.no_grad():
        ours = model(enc["input_ids"], enc["attention_mask"]).logits
        theirs = hf(**enc).logits
    valid = enc["attention_mask"].bool()
    torch.testing.assert_close(theirs[valid], ours[valid], atol=1e-5, rtol=0)
    ids = encode_prompt(tok, texts[0])
    assert hf_tok.decode(ids, skip_special_tokens=True) == tok.decode(ids)
    assert json.loads((out / "bertrace_export.json").read_text())["kind"] == "causal_lm"


def test_causal_classifier_exports_as_gpt2_for_sequence_classification(data, tmp_path):
    transformers = pytest.importorskip("transformers")
    from pipeline.finetune.encoding import collate_task_batch, encode_examples
    from pipeline.interop.export import export_hf
    from pipeline.models.checkpoint import save_finetuned

    tok_path = data / "tokenizer" / "tokenizer.json"
    d = tmp_path / "ft"
    d.mkdir()
    (d / "tokenizer.json").write_bytes(tok_path.read_bytes())
    lm, tok, _ = load_causal_lm(data / "pretrain" / "best.pt")
    clf = GPTForSequenceClassification(lm.config, 3)
    clf.load_pretrained_decoder(lm.state_dict())
    with torch.no_grad():
        clf.score.weight.mul_(30)
    clf.eval()
    save_finetuned(
        d / "model.pt",
        state_dict=clf.state_dict(),
        model_config=lm.config.to_dict(),
        label_names=["neg", "neu", "pos"],
        task={"text_columns": ["sentence"], "max_len": 32, "truncation": "head", "source": {"type": "local"}},
        tokenizer_sha256=sha256_file(tok_path),
        mode="full",
        seed=0,
        metrics={},
        provenance=fake_chain(),
        architecture="gpt",
    )
    info = export_hf(d / "model.pt", tmp_path / "hf-clf")
    assert info["architecture"] == "GPT2ForSequenceClassification"
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf-clf").eval()
    assert type(hf).__name__ == "GPT2ForSequenceClassification" and hf.config.id2label[2] == "pos"
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf-clf")
    texts = sentences(8, 4)
    ids, types, _ = encode_examples(tok, texts, None, 32)
    batch = collate_task_batch([(i, t, 0) for i, t in zip(ids, types)])
    enc = hf_tok(texts, padding=True, return_tensors="pt")
    assert torch.equal(enc["input_ids"], batch["input_ids"])
    with torch.no_grad():
        ours = clf(batch["input_ids"], None, batch["attention_mask"])
        theirs = hf(**enc).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
    assert len(set(ours.argmax(-1).tolist())) > 1  # the logits vary across texts: a real comparison
