"""ELECTRA (pipeline/models/electra.py, pipeline/pretrain/objectives/electra.py): equivalence with transformers' ElectraForPreTraining /
ElectraForMaskedLM, sampling and labels, learning on tiny shards, exact resume, the checkpoint in
fine-tuning, the Hugging Face export and import; and the objective names (mlm_nsp, mlm, electra)."""

from __future__ import annotations

import pytest
import torch

from pipeline.core.errors import BertraceError
from pipeline.models import checkpoint as ckpt_lib
from pipeline.models.bert import BertConfig, BertForSequenceClassification
from pipeline.models.electra import ElectraForPreTraining, generator_config, sample_tokens, uniform_noise
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.objectives.electra import ElectraPretraining, electra_losses
from pipeline.pretrain.objectives.registry import OBJECTIVES
from tests.support.examples_data import make_examples
from tests.support.pretraining import TINY, run, tiny_cfg, train_logs

V = 100


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return make_examples(
        tmp_path_factory.mktemp("ex"),
        masking="static",
        train_rows=512,
        valid_rows=64,
        rows_per_shard=256,
        row_group_size=64,
    )


def small_config(**kw) -> BertConfig:
    base = dict(
        vocab_size=V,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        max_position=64,
        embedding_size=16,
        gelu="exact",
        pooler_activation="gelu",
    )
    base.update(kw)
    return BertConfig(**base)


def toy_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (3, 12), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[2, 9:] = 0
    ids[2, 9:] = 0
    types = torch.zeros(3, 12, dtype=torch.long)
    types[:, 6:] = 1
    positions = torch.tensor([1, 4, 5, 12 + 2, 12 + 7, 24 + 3])
    labels = ids.reshape(-1)[positions].clone()
    ids.reshape(-1)[positions] = 4  # [MASK]
    return ids, types, mask, positions, labels


# ----------------------------------------------------------------------------- the model


def test_generator_config_follows_electra():
    c = BertConfig(
        vocab_size=V, hidden_size=256, num_layers=12, num_heads=4, intermediate_size=1024, embedding_size=128
    )
    g = generator_config(c)  # ELECTRA-Small: 1/4 width, same depth, embeddings of the discriminator
    assert (g.hidden_size, g.num_layers, g.num_heads, g.intermediate_size, g.embedding_dim) == (64, 12, 1, 256, 128)
    assert generator_config(c, 0.5, 0.5).hidden_size == 128 and generator_config(c, 0.5, 0.5).num_layers == 6
    with pytest.raises(BertraceError, match="generator of 0 layers"):
        generator_config(c, 0.25, 0.01)


def test_embeddings_are_shared_and_the_discriminator_is_the_bert_encoder():
    torch.manual_seed(0)
    c = small_config()
    m = ElectraForPreTraining(c, generator_config(c))
    assert m.generator.embeddings is m.bert.embeddings
    assert m.gen_head.decoder.weight is m.bert.embeddings.word.weight
    keys = set(m.state_dict())
    assert not any(k.startswith("generator.embeddings.") for k in keys)  # saved once, under bert.*
    assert {
        "bert.embeddings_project.weight",
        "generator.embeddings_project.weight",
        "disc_head.prediction.weight",
        "bert.pooler.weight",
    } <= keys
    assert not any(p.requires_grad for p in m.bert.pooler.parameters())  # unused in pre-training
    clf = BertForSequenceClassification(c, 2)
    clf.load_pretrained_encoder(m.state_dict())  # fine-tuning takes the discriminator as it is
    assert torch.equal(clf.bert.layers[1].ffn.fc.weight, m.bert.layers[1].ffn.fc.weight)


def test_sampling_replaces_only_masked_positions_and_labels_what_changed():
    torch.manual_seed(0)
    c = small_config()
    m = ElectraForPreTraining(c, generator_config(c)).eval()
    ids, types, mask, positions, labels = toy_batch()
    noise = uniform_noise(len(positions), "cpu", torch.Generator().manual_seed(1))
    out = m(ids, types, mask, positions, labels, noise)
    again = m(ids, types, mask, positions, labels, noise.clone())
    assert torch.equal(out.sampled, again.sampled)  # deterministic given the noise
    flat = out.disc_labels.reshape(-1)
    assert flat.sum() == (out.sampled != labels).sum()
    others = torch.ones_like(flat, dtype=torch.bool)
    others[positions] = False
    assert flat[others].abs().sum() == 0  # unmasked positions are original
    # a sample equal to the original counts as original: a generator that always says token 7,
    # on text whose masked tokens were 7
    with torch.no_grad():
        m.gen_head.decoder.bias[7] = 1e4
    sevens = torch.full_like(labels, 7)
    out = m(ids, types, mask, positions, sevens, noise)
    assert torch.equal(out.sampled, sevens) and out.disc_labels.sum() == 0
    # inverse-CDF sampling draws from softmax(logits): frequencies over many draws, and the ends
    probs = torch.tensor([[2.0, 0.0, -1.0, 1.0, -30.0]]).softmax(-1)
    draws = sample_tokens(probs.expand(20000, 5), uniform_noise(20000, "cpu", torch.Generator().manual_seed(0)))
    freq = torch.bincount(draws, minlength=5).float() / 20000
    torch.testing.assert_close(freq, probs[0], atol=0.015, rtol=0)
    assert freq[4] == 0  # p ~ 1e-14: drawn with probability 2^-40 at most
    top = torch.tensor([[0.0, 0.0], [1.0 - 2.0**-53] * 2], dtype=torch.float64)
    assert sample_tokens(probs.expand(2, 5), top).tolist() == [0, 4]  # the first id; the last with p > 0
    # two levels over a vocabulary of several blocks (and a partial last one): the same distribution
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(3)) * 2
    draws = sample_tokens(
        logits.softmax(-1).expand(40000, 300), uniform_noise(40000, "cpu", torch.Generator().manual_seed(4))
    )
    freq = torch.bincount(draws, minlength=300).float() / 40000
    torch.testing.assert_close(freq, logits.softmax(-1)[0], atol=0.01, rtol=0)
    assert draws.max() < 300


def _hf_models(c: BertConfig, g: BertConfig):
    transformers = pytest.importorskip("transformers")
    from pipeline.interop.hf import electra_hf_config

    torch.manual_seed(3)
    disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(**electra_hf_config(c))).eval()
    gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(**electra_hf_config(g))).eval()
    # ELECTRA shares the embeddings between the two networks: tie the random HF models first
    gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
    with torch.no_grad():
        for p in list(disc.parameters()) + list(gen.parameters()):
            p.add_(torch.randn_like(p) * 0.02)  # non-trivial LayerNorms and biases
        gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
    return disc, gen


def test_logits_and_losses_match_transformers_electra():
    """Weights of random transformers ElectraForPreTraining (discriminator) and ElectraForMaskedLM
    (generator, tied embeddings) copied into ours: logits within 1e-5, losses equal."""
    from pipeline.interop.hf import load_hf_electra_state_dict, to_hf_electra_state_dict

    c = small_config()
    g = generator_config(c)
    disc, gen = _hf_models(c, g)
    ours = ElectraForPreTraining(c, g).eval()
    load_hf_electra_state_dict(ours, disc.state_dict(), "discriminator")
    load_hf_electra_state_dict(ours, gen.state_dict(), "generator")
    ids, types, mask, positions, labels = toy_batch()
    noise = uniform_noise(len(positions), "cpu", torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = ours(ids, types, mask, positions, labels, noise)
        hf_gen = gen(input_ids=ids, token_type_ids=types, attention_mask=mask)
        torch.testing.assert_close(out.gen_logits, hf_gen.logits.reshape(-1, V)[positions], atol=1e-5, rtol=0)
        hf_labels = torch.full_like(ids, -100)
        hf_labels.reshape(-1)[positions] = labels
        gen_loss = gen(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=hf_labels).loss
        corrupted = ids.clone().reshape(-1)
        corrupted[positions] = out.sampled
        corrupted = corrupted.view_as(ids)
        hf_disc = disc(input_ids=corrupted, token_type_ids=types, attention_mask=mask, labels=out.disc_labels.long())
        valid = mask.bool()
        torch.testing.assert_close(out.disc_logits[valid], hf_disc.logits[valid], atol=1e-5, rtol=0)
        losses = electra_losses(out, labels, mask, disc_weight=50.0)
    torch.testing.assert_close(losses["gen_loss"], gen_loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(losses["disc_loss"], hf_disc.loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(losses["loss"], gen_loss + 50.0 * hf_disc.loss, atol=1e-5, rtol=1e-6)
    # and back: our weights in HF names load strictly into both transformers classes
    disc.load_state_dict(to_hf_electra_state_dict(ours, "discriminator"), strict=False)
    missing = disc.load_state_dict(to_hf_electra_state_dict(ours, "discriminator"), strict=False).missing_keys
    assert not [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))]
    assert set(to_hf_electra_state_dict(ours, "generator")) >= {
        k for k in gen.state_dict() if not k.endswith(("position_ids", "token_type_ids"))
    }


def test_electra_state_dict_from_hf_imports_a_discriminator():
    """What HF checkpoint import (#17) calls: a published ElectraForPreTraining -> our BertConfig
    and a state dict whose ``bert.*`` fine-tuning loads; the encoder's outputs equal HF's."""
    from pipeline.interop.hf import electra_state_dict_from_hf

    c = small_config()
    disc, _ = _hf_models(c, generator_config(c))
    config, sd = electra_state_dict_from_hf(disc.state_dict(), disc.config)
    assert config.embedding_size == 16 and config.pooler_activation == "gelu" and config.num_layers == 2
    assert config.gelu == "exact"
    clf = BertForSequenceClassification(config, 3).eval()
    clf.load_pretrained_encoder(sd)
    ids, types, mask, _, _ = toy_batch()
    with torch.no_grad():
        seq, _ = clf.bert(ids, types, mask)
        hf_seq = disc.electra(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(seq[mask.bool()], hf_seq[mask.bool()], atol=1e-5, rtol=0)
    assert sd["disc_head.prediction.weight"].shape == (1, 32)
    again = electra_state_dict_from_hf(disc.state_dict(), disc.config.to_dict())[1]
    assert torch.equal(again["bert.pooler.weight"], sd["bert.pooler.weight"])  # the same bytes every time
    bare = {k[len("electra.") :]: v for k, v in disc.electra.state_dict(prefix="electra.").items()}
    assert torch.equal(
        electra_state_dict_from_hf(bare, disc.config)[1]["bert.layers.1.attn.qkv.weight"],
        sd["bert.layers.1.attn.qkv.weight"],
    )
    broken = {k: v for k, v in disc.state_dict().items() if "layer.1.output.dense" not in k}
    with pytest.raises(BertraceError, match="missing"):
        electra_state_dict_from_hf(broken, disc.config)


# ----------------------------------------------------------------------------- params


def test_objective_names_and_the_removed_keys():
    assert set(OBJECTIVES) >= {"mlm_nsp", "mlm", "electra"}
    assert PretrainConfig(max_steps=1).objective == "mlm_nsp"  # the default (params.yaml)
    with pytest.raises(BertraceError, match=r"pretrain\.objective = 'bert'.*now called mlm_nsp.*mlm"):
        PretrainConfig(objective="bert", max_steps=1)
    with pytest.raises(BertraceError, match=r"nsp_weight = 0.*objective: mlm_nsp.*objective: mlm"):
        PretrainConfig.from_params({"nsp_weight": 0, "max_steps": 1})
    with pytest.raises(BertraceError, match=r"pretrain\.electra\.disc_weights: unknown key"):
        PretrainConfig(electra={"disc_weights": 1}, max_steps=1)
    with pytest.raises(
        BertraceError, match=r"pretrain\.electra\.generator_size = 2: must be <= 1 \(a fraction of the discriminator.s"
    ):
        PretrainConfig(electra={"generator_size": 2}, max_steps=1)
    with pytest.raises(BertraceError, match=r"pretrain\.electra\.disc_weight = 0: must be > 0"):
        PretrainConfig(electra={"disc_weight": 0}, max_steps=1)
    cfg = PretrainConfig(objective="electra", electra={"generator_size": 0.5}, max_steps=1)
    assert cfg.electra.generator_size == 0.5 and cfg.electra.disc_weight == 50.0
    assert cfg.to_dict()["electra"] == {"generator_size": 0.5, "generator_layers": 1.0, "disc_weight": 50.0}


def test_a_checkpoint_from_before_the_rename_resumes(examples, tmp_path):
    """last.pt written as objective bert + nsp_weight (before #15) continues as mlm_nsp / mlm."""
    for objective, nsp_weight in (("mlm_nsp", 1.0), ("mlm", 0.0)):
        out = tmp_path / objective
        run(tiny_cfg(objective=objective, max_steps=2), examples, out)
        state = ckpt_lib.load_checkpoint(out / "last.pt")
        state["train_config"].update(objective="bert", nsp_weight=nsp_weight)
        del state["train_config"]["electra"], state["train_config"]["mlm_nsp"]
        ckpt_lib.save_checkpoint(out / "last.pt", {k: v for k, v in state.items() if k not in ("format", "version")})
        if objective == "mlm_nsp":  # it was trained with NSP weighted 1 (the only weight then)
            with pytest.raises(BertraceError, match=r"'mlm_nsp': \(\{'nsp_weight': 1.0\}, \{'nsp_weight': 2.0\}\)"):
                run(tiny_cfg(objective=objective, max_steps=4, resume=True, mlm_nsp={"nsp_weight": 2.0}), examples, out)
        metrics, logs = run(tiny_cfg(objective=objective, max_steps=4, resume=True), examples, out)
        assert metrics["step"] == 4 and [s for s, _ in train_logs(logs)] == [3, 4]


# ----------------------------------------------------------------------------- training


def electra_cfg(**kw):
    model = {**TINY, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "embedding_size": 32}
    return tiny_cfg(**{"objective": "electra", "model": model, **kw})


def test_electra_trains_and_records_its_metrics(examples, tmp_path):
    cfg = electra_cfg(max_steps=120, log_every=20, eval_every=60, warmup=0.1, lr=3e-3)
    metrics, logs = run(cfg, examples, tmp_path)
    rows = [m for _, m in train_logs(logs)]
    assert set(rows[0]) >= {"loss", "gen_loss", "disc_loss", "replaced_fraction"}
    # measured: generator 4.86 -> 4.76 (ln 128 = 4.85 at first), discriminator 0.545 -> 0.396
    assert rows[-1]["gen_loss"] < rows[0]["gen_loss"] - 0.06, [r["gen_loss"] for r in rows]
    assert rows[-1]["disc_loss"] < rows[0]["disc_loss"] - 0.1, [r["disc_loss"] for r in rows]
    assert rows[-1]["loss"] < rows[0]["loss"] - 5
    assert 0.1 < rows[0]["replaced_fraction"] < 0.2  # the masked share (15 %): a near-uniform generator misses
    vals = [m for _, m in logs if "val_disc_loss" in m]
    assert len(vals) == 2 and metrics["best_val_disc_loss"] == min(v["val_disc_loss"] for v in vals)
    for v in vals:
        assert 0 <= v["val_disc_precision"] <= 1 and 0 <= v["val_disc_recall"] <= 1 and 0 < v["val_disc_acc"] <= 1
        assert v["val_loss"] == pytest.approx(v["val_gen_loss"] + 50 * v["val_disc_loss"])
    assert vals[-1]["val_disc_acc"] > 1 - vals[-1]["val_replaced_fraction"] - 0.02  # at least "all original"
    header = (tmp_path / "pretrain_val.csv").read_text().splitlines()[0]
    assert header.startswith("step,tokens,val_loss,val_gen_loss,val_gen_acc,val_disc_loss")
    state = ckpt_lib.load_checkpoint(tmp_path / "last.pt")
    assert state["train_config"]["objective"] == "electra"
    assert state["model_config"]["pooler_activation"] == "gelu" and state["model_config"]["embedding_size"] == 32
    # fine-tuning builds its classifier from the checkpoint's config and loads the discriminator
    clf = BertForSequenceClassification(BertConfig.from_dict(state["model_config"]), 2)
    clf.load_pretrained_encoder(state["model"], "last.pt")
    assert torch.equal(clf.bert.embeddings.word.weight, state["model"]["bert.embeddings.word.weight"])
    assert clf.bert.pooler_drop is not None  # ELECTRA's head: dropout, dense, GELU


def test_electra_validation_is_the_same_draw_every_time(examples, tmp_path):
    from pipeline.pretrain.data import PretrainingData
    from pipeline.pretrain.metrics import validation_metrics

    cfg = electra_cfg(max_steps=1)
    obj = ElectraPretraining.from_config(cfg)
    c = obj.model_config(BertConfig(**{**small_config().__dict__, "vocab_size": 128, "pooler_activation": "tanh"}))
    assert c.pooler_activation == "gelu"
    torch.manual_seed(0)
    model = obj.build_model(c)
    data = PretrainingData(examples, "valid", batch_size=16, seed=0)
    first = validation_metrics(model, obj, data, torch.device("cpu"), max_batches=2, batch_rows=16)
    rng = torch.get_rng_state()
    second = validation_metrics(model, obj, data, torch.device("cpu"), max_batches=2, batch_rows=16)
    assert first == second and torch.equal(rng, torch.get_rng_state())  # the training stream is untouched


def test_electra_resume_is_exact(examples, tmp_path):
    cfg = electra_cfg(max_steps=8, checkpoint_every=4, model={**TINY, "dropout": 0.1})
    full, logs_full = run(cfg, examples, tmp_path / "full")
    run(cfg, examples, tmp_path / "parts", stop_at_step=3)
    resumed, logs_resumed = run(cfg, examples, tmp_path / "parts")
    assert resumed["model_sha256"] == full["model_sha256"] and resumed["step"] == 8
    strip = lambda rows: [(s, {k: v for k, v in m.items() if k not in ("tokens_per_s",)}) for s, m in rows]  # noqa: E731
    assert strip(train_logs(logs_resumed)) == strip(train_logs(logs_full))[3:]
    other, _ = run(
        electra_cfg(max_steps=8, checkpoint_every=4, model={**TINY, "dropout": 0.1}, seed=1),
        examples,
        tmp_path / "seed1",
    )
    assert other["model_sha256"] != full["model_sha256"]


# ----------------------------------------------------------------------------- export


def _tokenizer_layout(tmp_path, vocab_size_hint=None):
    from tests.support.chain import train_tiny_tokenizer

    data = tmp_path / "data"
    tok_path = train_tiny_tokenizer(data / "tokenizer" / "tokenizer.json")
    return data, tok_path


def test_hf_export_of_electra_pretraining_and_finetuned(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    from pipeline.core.io import sha256_file
    from pipeline.finetune.encoding import collate_task_batch, encode_examples
    from pipeline.interop.export import export_hf
    from pipeline.models.checkpoint import save_checkpoint, save_finetuned
    from tests.support.chain import fake_chain, sentences

    data, tok_path = _tokenizer_layout(tmp_path)
    tok = Tokenizer.from_file(str(tok_path))
    c = small_config(vocab_size=tok.get_vocab_size(), gelu="tanh")
    torch.manual_seed(11)
    model = ElectraForPreTraining(c, generator_config(c)).eval()
    with torch.no_grad():
        model.disc_head.prediction.weight.mul_(30)  # logits of some size
    save_checkpoint(
        data / "pretrain" / "best.pt",
        {
            "model": model.state_dict(),
            "model_config": c.to_dict(),
            "step": 10,
            "train_config": {"objective": "electra", "electra": {"generator_size": 0.25, "generator_layers": 1.0}},
            "provenance": {"tokenizer_sha256": sha256_file(tok_path), "examples_manifest_sha256": "0" * 64},
        },
    )
    info = export_hf(data / "pretrain" / "best.pt", tmp_path / "hf-pre")
    assert info["architecture"] == "ElectraForPreTraining" and info["verification"]["max_abs_logit_diff"] < 1e-5
    hf = transformers.ElectraForPreTraining.from_pretrained(tmp_path / "hf-pre").eval()
    a, b = sentences(6, 7), sentences(6, 8)
    ids, types, _ = encode_examples(tok, a, b, 64)
    batch = collate_task_batch([(i, t, 0) for i, t in zip(ids, types)])
    with torch.no_grad():
        ours = model.discriminator_logits(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        theirs = hf(
            input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"]
        ).logits
    valid = batch["attention_mask"].bool()
    assert ours[valid].abs().max() > 0.1
    torch.testing.assert_close(theirs[valid], ours[valid], atol=1e-5, rtol=0)

    # fine-tuned from it: ELECTRA's classification head, exported as ElectraForSequenceClassification
    torch.manual_seed(12)
    clf = BertForSequenceClassification(c, 3).eval()
    clf.load_pretrained_encoder(model.state_dict())
    with torch.no_grad():
        clf.classifier.weight.mul_(30)
    ft = tmp_path / "ft"
    ft.mkdir()
    (ft / "tokenizer.json").write_bytes(tok_path.read_bytes())
    save_finetuned(
        ft / "model.pt",
        state_dict=clf.state_dict(),
        model_config=c.to_dict(),
        label_names=["a", "b", "c"],
        task={"text_columns": ["sentence"], "max_len": 32, "truncation": "head", "source": {"type": "local"}},
        tokenizer_sha256=sha256_file(tok_path),
        mode="full",
        seed=0,
        metrics={"validation_accuracy": 0.5},
        provenance=fake_chain(),
    )
    info = export_hf(ft / "model.pt", tmp_path / "hf-clf")
    assert info["architecture"] == "ElectraForSequenceClassification"
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf-clf").eval()
    assert type(hf).__name__ == "ElectraForSequenceClassification"
    ids, types, _ = encode_examples(tok, a, None, 32)
    batch = collate_task_batch([(i, t, 0) for i, t in zip(ids, types)])
    with torch.no_grad():
        ours = clf(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        theirs = hf(
            input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"]
        ).logits
    assert ours.abs().max() > 0.1
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- CPU bf16


def test_cpu_precision_auto_is_bf16_where_native_and_deterministic(examples, tmp_path, monkeypatch):
    """``precision: auto`` on a CPU: fp32 under the portable pins; with native kernels bf16 autocast
    where the CPU has bf16 instructions (AVX512-BF16, AMX, Arm BF16), fp32 elsewhere; a bf16 run is as reproducible as an fp32 one (same bytes twice)."""
    from pipeline.core.device import cpu_bf16_native, resolve_precision

    cpu = torch.device("cpu")
    monkeypatch.setenv("BERTRACE_CPU_BF16", "1")
    assert cpu_bf16_native() and resolve_precision("auto", cpu) == (torch.bfloat16, False)
    monkeypatch.setenv("BERTRACE_CPU_BF16", "0")
    assert not cpu_bf16_native() and resolve_precision("auto", cpu) == (None, False)
    assert resolve_precision("bf16", cpu) == (torch.bfloat16, False)  # asked for explicitly: always
    monkeypatch.delenv("BERTRACE_CPU_BF16")
    # the portable pins (compute.kernels: portable, set for the tests by conftest) cap oneDNN at AVX2: no bf16
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not cpu_bf16_native() and resolve_precision("auto", cpu) == (None, False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")  # native kernels: bf16 where the CPU has bf16 instructions
    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    assert cpu_bf16_native() == bool(
        caps.get("avx512_bf16") or caps.get("amx_bf16") or caps.get("bf16") or caps.get("sve_bf16")
    )
    for objective in ("mlm_nsp", "electra"):
        runs = [
            run(
                tiny_cfg(objective=objective, precision=p, max_steps=4, model={**TINY, "dropout": 0.1}),
                examples,
                tmp_path / f"{objective}-{p}-{i}",
            )[0]
            for p, i in (("bf16", 0), ("bf16", 1), ("fp32", 0))
        ]
        assert runs[0]["precision"] == "bf16" and runs[0]["model_sha256"] == runs[1]["model_sha256"]
        assert runs[2]["model_sha256"] != runs[0]["model_sha256"]
        assert abs(runs[2]["loss"] - runs[0]["loss"]) < 0.05 * runs[2]["loss"]
