"""pipeline.models.bert: faithfulness to Hugging Face's BERT, weight tying, init, optimizer groups,
presets, padding invariance, the masked-position gather, FLOP count and HF name mapping."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from pipeline.core.errors import BertraceError
from pipeline.interop.hf import config_from_hf, hf_config, load_hf_state_dict, to_hf_state_dict
from pipeline.models.bert import (
    BertConfig,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
    config_from_params,
    flops_per_token,
    num_parameters,
    param_groups,
    pretraining_correct,
    pretraining_loss,
)
from tests.support.weights import randomize

V = 211  # tiny vocabulary: these tests are about the math, not the size


def tiny(**kw) -> BertConfig:
    d = dict(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position=64)
    d.update(kw)
    return BertConfig(**d)


def batch(B=4, T=24, seed=0):
    """Random ids with [CLS]/[SEP], two segments, and right padding on some rows."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    lengths = [T, T - 7, T - 1, 9][:B]
    mask = torch.zeros(B, T, dtype=torch.long)
    token_type = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, 0], ids[b, n // 2], ids[b, n - 1] = 2, 3, 3
        token_type[b, n // 2 + 1 : n] = 1
        ids[b, n:] = 0
    # masked positions: a few real (unpadded) positions per row, as flat indices b * T + t
    positions = torch.cat([b * T + torch.tensor([1, 3, n // 2 + 2]) for b, n in enumerate(lengths)])
    return ids, token_type, mask, positions


# --------------------------------------------------------------------------------------------
# Faithfulness: same weights, same inputs -> the same logits as transformers


def _hf_pair(config: BertConfig, hf_act: str | None = None):
    transformers = pytest.importorskip("transformers")
    hf_cfg = hf_config(config)
    if hf_act is not None:
        hf_cfg["hidden_act"] = hf_act
    hf = transformers.BertForPreTraining(transformers.BertConfig(**hf_cfg)).eval()
    randomize(hf, seed=1)
    ours = BertForPreTraining(config).eval()
    load_hf_state_dict(ours, hf.state_dict())
    return ours, hf


@pytest.mark.parametrize("gelu,hf_act", [("exact", "gelu"), ("tanh", "gelu_new"), ("tanh", "gelu_pytorch_tanh")])
def test_pretraining_logits_match_hugging_face(gelu, hf_act):
    ours, hf = _hf_pair(tiny(gelu=gelu), hf_act)
    ids, token_type, mask, positions = batch()
    with torch.no_grad():
        out = ours(ids, token_type, mask, positions)
        ref = hf(input_ids=ids, token_type_ids=token_type, attention_mask=mask)
    hf_mlm = ref.prediction_logits.reshape(-1, V)[positions]
    assert out.mlm_logits.shape == (len(positions), V)
    torch.testing.assert_close(out.mlm_logits, hf_mlm, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.nsp_logits, ref.seq_relationship_logits, atol=1e-5, rtol=0)
    # the logits are not trivially small: the comparison means something
    assert out.mlm_logits.abs().max() > 0.01


def test_pretraining_loss_and_gradients_match_hugging_face():
    """HF's loss with -100 labels (DataCollatorForLanguageModeling) equals ours on the gathered
    rows, and the gradients agree, the tied embedding's included."""
    ours, hf = _hf_pair(tiny(gelu="exact"))
    ids, token_type, mask, positions = batch()
    g = torch.Generator().manual_seed(3)
    mlm_labels = torch.randint(5, V, (len(positions),), generator=g)
    nsp_labels = torch.tensor([0, 1, 1, 0])
    hf_labels = torch.full(ids.shape, -100).reshape(-1)
    hf_labels[positions] = mlm_labels
    total, mlm, nsp = pretraining_loss(ours(ids, token_type, mask, positions), mlm_labels, nsp_labels)
    ref = hf(
        input_ids=ids,
        token_type_ids=token_type,
        attention_mask=mask,
        labels=hf_labels.reshape(ids.shape),
        next_sentence_label=nsp_labels,
    )
    torch.testing.assert_close(total, ref.loss, atol=1e-5, rtol=0)
    torch.testing.assert_close(total, mlm + nsp)
    total.backward()
    ref.loss.backward()
    emb, hf_emb = ours.bert.embeddings.word.weight.grad, hf.bert.embeddings.word_embeddings.weight.grad
    torch.testing.assert_close(emb, hf_emb, atol=1e-6, rtol=1e-4)
    hf_attn = hf.bert.encoder.layer[0].attention.self
    hf_qkv = torch.cat([hf_attn.query.weight.grad, hf_attn.key.weight.grad, hf_attn.value.weight.grad])
    torch.testing.assert_close(ours.bert.layers[0].attn.qkv.weight.grad, hf_qkv, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(ours.mlm.decoder.bias.grad, hf.cls.predictions.bias.grad, atol=1e-6, rtol=1e-4)


def test_nsp_weight_scales_the_nsp_term_and_zero_leaves_the_nsp_head_untrained():
    """nsp_weight 1 is BERT's sum (objective mlm_nsp); 0 is MLM only (objective mlm: no gradient
    reaches the NSP head or the pooler, which only NSP trains); the reported parts stay the same."""
    torch.manual_seed(0)
    m = BertForPreTraining(tiny())
    ids, token_type, mask, positions = batch()
    mlm_labels, nsp_labels = torch.randint(5, V, (len(positions),)), torch.tensor([0, 1, 1, 0])
    out = m(ids, token_type, mask, positions)
    one = pretraining_loss(out, mlm_labels, nsp_labels)
    half = pretraining_loss(out, mlm_labels, nsp_labels, nsp_weight=0.5)
    torch.testing.assert_close(half[0], one[1] + 0.5 * one[2])
    assert half[1].item() == one[1].item() and half[2].item() == one[2].item() and one[2].item() > 0.1
    zero = pretraining_loss(out, mlm_labels, nsp_labels, nsp_weight=0.0)
    torch.testing.assert_close(zero[0], one[1])
    zero[0].backward()
    for untrained in (m.nsp.weight, m.bert.pooler.weight):
        assert untrained.grad is None or untrained.grad.abs().sum() == 0
    assert m.bert.embeddings.word.weight.grad.abs().sum() > 0
    from pipeline.pretrain.config import PretrainConfig
    from pipeline.pretrain.objectives.registry import OBJECTIVES, make_objective

    assert OBJECTIVES["mlm"].nsp_weight == 0.0 and OBJECTIVES["mlm_nsp"].nsp_weight == 1.0
    with pytest.raises(BertraceError, match="nsp_weight = 0.*is gone.*objective: mlm"):
        PretrainConfig(nsp_weight=0, max_steps=1)
    # pretrain.mlm_nsp.nsp_weight reaches the loss (and val_loss); objective mlm ignores it
    cfg = PretrainConfig(mlm_nsp={"nsp_weight": 3.0}, max_steps=1)
    weighted = make_objective(cfg)
    assert weighted.nsp_weight == 3.0 and make_objective(PretrainConfig(objective="mlm", max_steps=1)).nsp_weight == 0
    total = weighted.losses(out, SimpleNamespace(masked_lm_labels=mlm_labels, next_sentence_labels=nsp_labels))
    torch.testing.assert_close(total["loss"], one[1] + 3.0 * one[2])
    assert weighted.eval_metrics([8.0, 1, 4, 2.0, 1, 4])["val_loss"] == 2.0 + 3.0 * 0.5
    with pytest.raises(BertraceError, match=r"pretrain\.mlm_nsp\.nsp_weight.*> 0.*objective: mlm"):
        PretrainConfig(mlm_nsp={"nsp_weight": 0}, max_steps=1)


def test_sequence_classification_matches_hugging_face():
    transformers = pytest.importorskip("transformers")
    config = tiny(gelu="exact")
    hf = transformers.BertForSequenceClassification(transformers.BertConfig(**hf_config(config, num_labels=3))).eval()
    randomize(hf, seed=2)
    ours = BertForSequenceClassification(config, num_labels=3).eval()
    load_hf_state_dict(ours, hf.state_dict())
    ids, token_type, mask, _ = batch()
    with torch.no_grad():
        logits = ours(ids, token_type, mask)
        ref = hf(input_ids=ids, token_type_ids=token_type, attention_mask=mask).logits
    assert logits.shape == (4, 3)
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=0)


def test_to_hf_state_dict_loads_strictly_into_transformers_and_round_trips():
    transformers = pytest.importorskip("transformers")
    config = tiny()
    ours = BertForPreTraining(config).eval()
    randomize(ours, seed=4)
    sd = to_hf_state_dict(ours)
    hf = transformers.BertForPreTraining(transformers.BertConfig(**hf_config(config))).eval()
    assert set(sd) == set(hf.state_dict())
    hf.load_state_dict(sd, strict=True)
    ids, token_type, mask, positions = batch()
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=token_type, attention_mask=mask)
        out = ours(ids, token_type, mask)
    torch.testing.assert_close(out.mlm_logits, ref.prediction_logits, atol=1e-5, rtol=0)
    # HF -> ours -> HF is the identity
    back = BertForPreTraining(config)
    load_hf_state_dict(back, hf.state_dict())
    for k, v in to_hf_state_dict(back).items():
        assert torch.equal(v, sd[k]), k
    # the classifier too
    cls = BertForSequenceClassification(config, num_labels=2).eval()
    randomize(cls, seed=5)
    hf_cls = transformers.BertForSequenceClassification(
        transformers.BertConfig(**hf_config(config, num_labels=2))
    ).eval()
    hf_cls.load_state_dict(to_hf_state_dict(cls), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(
            cls(ids, token_type, mask),
            hf_cls(input_ids=ids, token_type_ids=token_type, attention_mask=mask).logits,
            atol=1e-5,
            rtol=0,
        )


def test_load_hf_state_dict_errors_name_the_problem():
    config = tiny()
    sd = to_hf_state_dict(BertForPreTraining(config))
    target = BertForPreTraining(config)
    broken = dict(sd)
    del broken["bert.encoder.layer.1.output.dense.weight"]
    with pytest.raises(BertraceError, match="missing.*layer.1.output.dense.weight"):
        load_hf_state_dict(target, broken)
    with pytest.raises(BertraceError, match="unexpected.*extra"):
        load_hf_state_dict(target, {**sd, "extra.weight": torch.zeros(1)})
    wrong = to_hf_state_dict(BertForPreTraining(tiny(intermediate_size=48)))
    with pytest.raises(BertraceError, match="shapes differ"):
        load_hf_state_dict(target, wrong)
    # tied entries may be absent; a pre-training checkpoint loads into a classifier with strict=False
    untied = {k: v for k, v in sd.items() if not k.startswith("cls.predictions.decoder")}
    load_hf_state_dict(target, untied)
    clf = BertForSequenceClassification(config, num_labels=2)
    with pytest.raises(BertraceError, match="missing.*classifier.weight"):
        load_hf_state_dict(clf, sd, strict=False)
    sd_cls = {**sd, "classifier.weight": torch.zeros(2, 32), "classifier.bias": torch.zeros(2)}
    load_hf_state_dict(clf, sd_cls, strict=False)
    assert torch.equal(clf.bert.embeddings.word.weight, sd["bert.embeddings.word_embeddings.weight"])


def test_hf_config_fields():
    transformers = pytest.importorskip("transformers")
    for gelu, act in [("tanh", "gelu_pytorch_tanh"), ("exact", "gelu")]:
        config = tiny(gelu=gelu, dropout=0.2, attention_dropout=0.05)
        hf = transformers.BertConfig(**hf_config(config, num_labels=5))
        assert (hf.num_hidden_layers, hf.hidden_size, hf.num_attention_heads, hf.intermediate_size) == (2, 32, 4, 64)
        assert (hf.hidden_act, hf.hidden_dropout_prob, hf.attention_probs_dropout_prob) == (act, 0.2, 0.05)
        assert (hf.vocab_size, hf.max_position_embeddings, hf.layer_norm_eps, hf.num_labels) == (V, 64, 1e-12, 5)
        assert config_from_hf(hf.to_dict()) == config
    assert config_from_hf({**hf_config(tiny()), "hidden_act": "gelu_new"}).gelu == "tanh"
    with pytest.raises(BertraceError, match="hidden_act 'relu'"):
        config_from_hf({**hf_config(tiny()), "hidden_act": "relu"})


# --------------------------------------------------------------------------------------------
# Structure: tying, init, optimizer groups, presets


def test_decoder_weight_is_tied_and_gradients_reach_the_embedding():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny())
    emb = model.bert.embeddings.word.weight
    assert model.mlm.decoder.weight is emb
    assert model.mlm.decoder.weight.data_ptr() == emb.data_ptr()
    assert num_parameters(model) == sum(p.numel() for p in set(model.parameters()))
    ids = torch.randint(5, 50, (2, 16))  # ids < 50 only: rows >= 50 get gradient via the decoder only
    out = model(ids, masked_positions=torch.tensor([1, 2, 17]))
    pretraining_loss(out, torch.tensor([7, 8, 9]), torch.tensor([0, 1]))[0].backward()
    assert emb.grad[50:].abs().sum() > 0
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-2)
    opt.step()
    assert model.mlm.decoder.weight is model.bert.embeddings.word.weight  # still one tensor
    assert "mlm.decoder.weight" not in dict(model.named_parameters())  # listed once, under the embedding


def test_init_statistics():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=4000, hidden_size=256, num_layers=1, num_heads=4, intermediate_size=1024)
    model = BertForPreTraining(config)
    for w in (
        model.bert.embeddings.word.weight,
        model.bert.layers[0].ffn.fc.weight,
        model.bert.layers[0].attn.qkv.weight,
    ):
        assert abs(w.std().item() - 0.02) < 0.0005
        assert abs(w.mean().item()) < 0.0005
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert torch.all(p == 0), name
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)
            assert m.eps == 1e-12
    clf = BertForSequenceClassification(config, num_labels=2)
    assert torch.all(clf.classifier.bias == 0) and clf.classifier.weight.std() < 0.05


def test_init_is_deterministic_under_a_seed():
    torch.manual_seed(7)
    a = BertForPreTraining(tiny()).state_dict()
    torch.manual_seed(7)
    b = BertForPreTraining(tiny()).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("which", ["ours", "hf"])
def test_param_groups_split_decay_and_no_decay_exactly(which):
    if which == "ours":
        model = BertForPreTraining(tiny())
    else:
        transformers = pytest.importorskip("transformers")
        model = transformers.BertForPreTraining(transformers.BertConfig(**hf_config(tiny())))
    decay, no_decay = param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    ids = [id(p) for p in decay["params"] + no_decay["params"]]
    assert len(ids) == len(set(ids))  # nothing duplicated (the tied weight once)
    assert set(ids) == {id(p) for p in model.parameters()}  # nothing missed
    no_decay_ids = {id(p) for p in no_decay["params"]}
    ln_params = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    for name, p in model.named_parameters():
        if name.endswith("bias") or id(p) in ln_params:
            assert id(p) in no_decay_ids, name
        else:
            assert p.dim() == 2 and id(p) not in no_decay_ids, name
    # embedding LN (2) + per layer: biases (ours 4: qkv, proj, fc, proj; HF 6) + 2 LNs (4)
    # + pooler bias + MLM dense bias + MLM LN (2) + decoder bias + NSP bias
    per_layer = 4 + 4 if which == "ours" else 6 + 4
    assert len(no_decay["params"]) == 2 + 2 * per_layer + 1 + 1 + 2 + 1 + 1


@pytest.mark.parametrize(
    "name,layers,hidden",
    [("tiny", 2, 128), ("mini", 4, 256), ("small", 4, 512), ("medium", 8, 512), ("base", 12, 768), ("large", 24, 1024)],
)
def test_presets(name, layers, hidden):
    config = config_from_params({"preset": name}, vocab_size=1000)
    assert (config.num_layers, config.hidden_size) == (layers, hidden)
    assert config.num_heads == hidden // 64 and config.intermediate_size == 4 * hidden
    assert config.vocab_size == 1000 and config.gelu == "tanh"
    with torch.device("meta"):  # shapes without allocating (large has 300M parameters)
        model = BertForPreTraining(config)
    assert len(model.bert.layers) == layers
    assert model.bert.embeddings.word.weight.shape == (1000, hidden)
    assert model.bert.layers[0].attn.qkv.weight.shape == (3 * hidden, hidden)
    assert model.bert.layers[0].ffn.fc.weight.shape == (4 * hidden, hidden)
    assert model.nsp.weight.shape == (2, hidden)


def test_parameter_counts_of_google_bert_base_and_large():
    # the published sizes of bert-base-uncased / bert-large-uncased (BertModel, pooler included)
    with torch.device("meta"):
        base = BertModel(config_from_params({"preset": "base"}, 30522))
        large = BertModel(config_from_params({"preset": "large"}, 30522))
    assert num_parameters(base) == 109_482_240
    assert num_parameters(large) == 335_141_888


def test_tiny_preset_forward_shapes():
    torch.manual_seed(0)
    config = config_from_params({"preset": "tiny", "max_position": 32}, vocab_size=V)
    model = BertForPreTraining(config).eval()
    ids = torch.randint(5, V, (3, 20))
    seq, pooled = model.bert(ids)
    assert seq.shape == (3, 20, 128) and pooled.shape == (3, 128)
    out = model(ids)
    assert out.mlm_logits.shape == (3, 20, V) and out.nsp_logits.shape == (3, 2)
    clf = BertForSequenceClassification(config, num_labels=4)
    assert clf(ids).shape == (3, 4)


def test_config_from_params_overrides_and_errors():
    config = config_from_params({"preset": "mini", "dropout": 0.0, "gelu": "exact", "vocab_size": 16064}, 16000)
    assert (config.dropout, config.gelu, config.vocab_size, config.num_layers) == (0.0, "exact", 16064, 4)
    with pytest.raises(BertraceError, match=r"pretrain\.model\.hiden_size: unknown key; valid keys: .*hidden_size"):
        config_from_params({"preset": "mini", "hiden_size": 128}, 16000)
    with pytest.raises(BertraceError, match=r"pretrain\.model\.preset = 'huge': input should be 'tiny', 'mini'"):
        config_from_params({"preset": "huge"}, 16000)
    with pytest.raises(BertraceError, match=r"pretrain\.model\.preset is missing"):
        config_from_params({}, 16000)
    with pytest.raises(BertraceError, match=r"pretrain\.model\.vocab_size = 100: smaller than the tokenizer's 16000"):
        config_from_params({"preset": "mini", "vocab_size": 100}, 16000)
    with pytest.raises(BertraceError, match="not a multiple of num_heads"):
        config_from_params({"preset": "mini", "num_heads": 3}, 16000)
    with pytest.raises(BertraceError, match="pretrain.model must be a mapping"):
        config_from_params("mini", 16000)
    with pytest.raises(BertraceError, match=r"pretrain\.model\.dropout = 1\.5: must be < 1"):
        config_from_params({"preset": "mini", "dropout": 1.5}, 16000)
    with pytest.raises(BertraceError, match=r"pretrain\.model: tokenizer_vocab_size comes from the tokenizer"):
        config_from_params({"preset": "mini", "tokenizer_vocab_size": 10}, 16000)
    # a key left out takes the preset's value, else BertConfig's (Google's) default: dropout 0.1
    assert config_from_params({"preset": "mini"}, 16000).dropout == 0.1
    with pytest.raises(BertraceError, match="gelu must be"):
        BertConfig(gelu="relu")
    with pytest.raises(BertraceError, match="dropout must be a number in"):
        BertConfig(dropout=1.5)
    with pytest.raises(BertraceError, match="num_heads must be a positive integer"):
        BertConfig(num_heads=0)
    with pytest.raises(BertraceError, match="unknown keys"):
        BertConfig.from_dict({"hidden": 1})
    config = tiny(gelu="exact")
    assert BertConfig.from_dict(config.to_dict()) == config


# --------------------------------------------------------------------------------------------
# Behaviour: padding, gather, losses, errors, FLOPs


def test_padding_does_not_change_unpadded_outputs():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny()).eval()
    ids = torch.randint(5, V, (1, 10))
    token_type = torch.tensor([[0] * 5 + [1] * 5])
    with torch.no_grad():
        seq, pooled = model.bert(ids, token_type)
        padded = torch.cat([ids, torch.zeros(1, 6, dtype=torch.long)], dim=1)
        pad_tt = torch.cat([token_type, torch.zeros(1, 6, dtype=torch.long)], dim=1)
        pad_mask = torch.tensor([[1] * 10 + [0] * 6])
        seq_p, pooled_p = model.bert(padded, pad_tt, pad_mask)
        # in a batch next to a longer row, too
        both = torch.cat([padded, torch.randint(5, V, (1, 16))])
        seq_b, pooled_b = model.bert(both, torch.cat([pad_tt, pad_tt]), torch.cat([pad_mask, torch.ones(1, 16)]).long())
    torch.testing.assert_close(seq_p[:, :10], seq, atol=1e-5, rtol=0)
    torch.testing.assert_close(pooled_p, pooled, atol=1e-5, rtol=0)
    torch.testing.assert_close(seq_b[:1, :10], seq, atol=1e-5, rtol=0)
    torch.testing.assert_close(pooled_b[:1], pooled, atol=1e-5, rtol=0)
    # without the mask the padding is attended to, and the outputs change: the mask matters
    with torch.no_grad():
        seq_u, _ = model.bert(padded, pad_tt)
    assert (seq_u[:, :10] - seq).abs().max() > 1e-3
    # an all-ones mask (the no-padding fast path) equals no mask
    with torch.no_grad():
        seq_1, pooled_1 = model.bert(ids, token_type, torch.ones(1, 10, dtype=torch.long))
    torch.testing.assert_close(seq_1, seq, atol=0, rtol=0)


def test_masked_positions_gather_equals_full_logits():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny()).eval()
    ids, token_type, mask, positions = batch()
    with torch.no_grad():
        full = model(ids, token_type, mask)
        gathered = model(ids, token_type, mask, positions)
    B, T = ids.shape
    assert full.mlm_logits.shape == (B, T, V)
    torch.testing.assert_close(gathered.mlm_logits, full.mlm_logits.reshape(B * T, V)[positions], atol=1e-6, rtol=0)
    torch.testing.assert_close(gathered.nsp_logits, full.nsp_logits)
    # pretraining_loss: [N] labels on gathered rows == [B, T] labels with -100 on full logits
    labels = torch.arange(len(positions)) % V
    full_labels = torch.full((B * T,), -100)
    full_labels[positions] = labels
    nsp = torch.tensor([1, 0, 1, 1])
    a = pretraining_loss(gathered, labels, nsp)
    b = pretraining_loss(full, full_labels.reshape(B, T), nsp)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0)
    with pytest.raises(BertraceError, match="1-D flat indices"):
        model(ids, token_type, mask, positions.reshape(4, -1))


def test_cpu_dropout_drops_a_share_p_scales_the_rest_and_follows_the_seed():
    from pipeline.models.primitives import Dropout, dropout

    x = torch.ones(1001, 999, requires_grad=True)
    torch.manual_seed(0)
    y = dropout(x, 0.1)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.002  # 1M Bernoulli(0.1) draws: sd 0.0003
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 65536 / (65536 - 6554)))  # 1 / (1 - p rounded to 2^-16)
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # the gradient goes through the same mask and scale
    torch.manual_seed(0)
    assert torch.equal(dropout(x.detach(), 0.1), y.detach())  # the global generator's seed fixes the mask
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0) is x
    assert dropout(torch.ones(3, 5), 1.0).eq(0).all()
    odd = dropout(torch.ones(7), 0.5)  # an odd number of elements: the last 32-bit draw is half used
    assert odd.shape == (7,) and set(odd.tolist()) <= {0.0, 2.0}
    module = Dropout(0.3)
    assert module(x).ne(0).float().mean().item() == pytest.approx(0.7, abs=0.003) and module.eval()(x) is x


@pytest.mark.parametrize("padded_vocab, chunk", [(False, 64), (True, 5)])
def test_fused_mlm_loss_equals_the_loss_of_the_logits(padded_vocab, chunk, monkeypatch):
    """Training's MLM loss is computed with the decoder in chunks (linear_cross_entropy): the same
    loss and gradients as cross entropy on the logits, a padded vocabulary's extra ids never
    predicted, -100 labels ignored, chunks that do not divide the rows."""
    import pipeline.models.primitives as M

    monkeypatch.setattr(M.linear_cross_entropy, "__defaults__", (None, chunk))
    torch.manual_seed(0)
    config = tiny(
        dropout=0.0, attention_dropout=0.0, **({"vocab_size": 256, "tokenizer_vocab_size": V} if padded_vocab else {})
    )
    ids, token_type, mask, positions = batch()
    labels = torch.arange(len(positions)) % V
    labels[::7] = -100
    nsp = torch.tensor([1, 0, 1, 1])
    grads = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = BertForPreTraining(config).train()
        out = model(ids, token_type, mask, positions, mlm_labels=labels if fused else None)
        assert (out.mlm_logits is None) == fused and (out.mlm_loss is not None) == fused
        loss = pretraining_loss(out, labels, nsp)
        loss[0].backward()
        grads.append((loss, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}))
    (plain, g_plain), (fused, g_fused) = grads
    for x, y in zip(plain, fused):
        torch.testing.assert_close(x, y, atol=2e-6, rtol=0)
    assert g_plain.keys() == g_fused.keys()
    for k in g_plain:
        torch.testing.assert_close(g_fused[k], g_plain[k], atol=1e-6, rtol=1e-4, msg=k)


@pytest.mark.parametrize("pre_ln", [False, True])
def test_bert_model_rows_compute_exactly_the_full_rows(pre_ln):
    """The last layer run only at ``rows`` (+ [CLS]) gives the full computation's values there."""
    torch.manual_seed(0)
    model = BertModel(tiny(pre_ln=pre_ln)).eval()
    ids, token_type, mask, positions = batch()
    with torch.no_grad():
        seq, pooled = model(ids, token_type, mask)
        seq_r, pooled_r = model(ids, token_type, mask, rows=positions)
        seq_0, pooled_0 = model(ids, token_type, mask, rows=torch.zeros(0, dtype=torch.long))
    B, T = ids.shape
    assert seq_r.shape == (len(positions), 32) and seq_0.shape == (0, 32)
    torch.testing.assert_close(seq_r, seq.reshape(B * T, -1)[positions], atol=1e-6, rtol=0)
    torch.testing.assert_close(pooled_r, pooled, atol=1e-6, rtol=0)
    torch.testing.assert_close(pooled_0, pooled, atol=1e-6, rtol=0)


def test_pre_ln_layers_normalise_before_each_sublayer_and_once_after_the_last():
    """``pre_ln: true``: x + attn(LN(x)), x + ffn(LN(x)), then a final LayerNorm (Xiong et al. 2020),
    written out here from the model's own modules, against BertModel's output; post-LN (BERT) has
    no final LayerNorm and a different output from the same weights."""
    torch.manual_seed(0)
    model = BertModel(tiny(pre_ln=True)).eval()
    randomize(model, seed=3)
    ids, token_type, mask, _ = batch()
    with torch.no_grad():
        seq, pooled = model(ids, token_type, mask)
        m = mask.bool()[:, None, None, :]
        x = model.embeddings(ids, token_type)
        for layer in model.layers:
            x = x + layer.attn(layer.ln_attn(x), m)
            x = x + layer.ffn(layer.ln_ffn(x))
        x = model.ln_final(x)
        torch.testing.assert_close(seq, x, atol=1e-5, rtol=0)
        torch.testing.assert_close(pooled, torch.tanh(model.pooler(x[:, 0])), atol=1e-5, rtol=0)
        post = BertModel(tiny()).eval()
        assert post.ln_final is None
        missing, unexpected = post.load_state_dict(model.state_dict(), strict=False)
        assert missing == [] and unexpected == ["ln_final.weight", "ln_final.bias"]
        assert not torch.allclose(post(ids, token_type, mask)[0], seq, atol=1e-3)


def test_pre_ln_config_round_trips_and_rejects_a_non_boolean():
    assert "pre_ln" not in tiny().to_dict()  # BERT's post-LN: configs (and checkpoints) read as before
    d = tiny(pre_ln=True).to_dict()
    assert d["pre_ln"] is True and BertConfig.from_dict(d).pre_ln is True
    assert config_from_params({"preset": "tiny", "pre_ln": True}, vocab_size=V).pre_ln is True
    with pytest.raises(BertraceError, match="pre_ln must be true or false, got 'yes'"):
        tiny(pre_ln="yes")
    # pre-training trains the final LayerNorm; it never decays (a LayerNorm)
    model = BertForPreTraining(tiny(pre_ln=True))
    no_decay = {id(p) for p in param_groups(model, 0.01)[1]["params"]}
    assert {id(model.bert.ln_final.weight), id(model.bert.ln_final.bias)} <= no_decay
    ids, token_type, mask, positions = batch()
    out = model(ids, token_type, mask, positions)
    labels = ids.reshape(-1)[positions]
    total, _, _ = pretraining_loss(out, labels, torch.zeros(ids.size(0), dtype=torch.long))
    total.backward()
    assert model.bert.ln_final.weight.grad is not None and model.bert.ln_final.weight.grad.abs().sum() > 0


def test_mean_pooling_reads_the_unpadded_tokens_through_the_pooler():
    """classifier_pooling mean: the pooler (dense + tanh) reads each row's mean over its real
    tokens, so padding a row, or batching it with a longer one, leaves its logits as they are."""
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny(classifier_pooling="mean"), 3).eval()
    randomize(model, seed=1)
    ids, token_type, mask, _ = batch()
    with torch.no_grad():
        logits = model(ids, token_type, mask)
        seq, _ = model.bert(ids, token_type, mask)
        for b in range(ids.size(0)):
            n = int(mask[b].sum())
            by_hand = model.classifier(torch.tanh(model.bert.pooler(seq[b, :n].mean(0))))
            torch.testing.assert_close(logits[b], by_hand, atol=1e-5, rtol=0)
        n = int(mask[1].sum())  # a padded row, alone and unpadded
        alone = model(ids[1:2, :n], token_type[1:2, :n], mask[1:2, :n])
        unmasked = model(ids[1:2, :n], token_type[1:2, :n])
        cls_model = BertForSequenceClassification(tiny(), 3).eval()
        cls_model.load_state_dict(model.state_dict())
        cls_logits = cls_model(ids, token_type, mask)
    torch.testing.assert_close(alone[0], logits[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(unmasked, alone, atol=1e-6, rtol=0)
    assert (cls_logits - logits).abs().max() > 1e-3  # the same weights read [CLS] otherwise


def test_classifier_pooling_config_round_trips_and_rejects_other_values():
    assert "classifier_pooling" not in tiny().to_dict()  # [CLS]: configs (and checkpoints) read as before
    d = tiny(classifier_pooling="mean").to_dict()
    assert d["classifier_pooling"] == "mean" and BertConfig.from_dict(d).classifier_pooling == "mean"
    with pytest.raises(BertraceError, match="classifier_pooling must be 'cls' or 'mean', got 'max'"):
        tiny(classifier_pooling="max")


def test_pretraining_correct_counts():
    from pipeline.models.bert import PreTrainingOutput

    mlm = torch.zeros(4, 5)
    mlm[torch.arange(4), torch.tensor([1, 2, 3, 4])] = 1.0  # predicts 1, 2, 3, 4
    nsp = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])  # predicts 0, 1, 0
    out = PreTrainingOutput(mlm, nsp)
    mc, mn, nc, nn_ = pretraining_correct(out, torch.tensor([1, 2, 0, -100]), torch.tensor([0, 0, 0]))
    assert (mc.item(), mn.item(), nc.item(), nn_.item()) == (2, 3, 2, 3)


def test_sequence_classifier_loads_pretrained_encoder():
    torch.manual_seed(0)
    config = tiny()
    pre = BertForPreTraining(config).eval()
    clf = BertForSequenceClassification(config, num_labels=2).eval()
    # as saved from a torch.compile'd model
    clf.load_pretrained_encoder({"_orig_mod." + k: v for k, v in pre.state_dict().items()})
    ids, token_type, mask, _ = batch()
    with torch.no_grad():
        torch.testing.assert_close(clf.bert(ids, token_type, mask)[1], pre.bert(ids, token_type, mask)[1])
    with pytest.raises(BertraceError, match="different model config"):
        clf.load_pretrained_encoder(BertForPreTraining(tiny(num_layers=3)).state_dict())
    with pytest.raises(BertraceError, match="shapes differ"):
        clf.load_pretrained_encoder(BertForPreTraining(tiny(intermediate_size=48)).state_dict())
    with pytest.raises(BertraceError, match="no 'bert"):
        clf.load_pretrained_encoder({"x": torch.zeros(1)})


def test_dropout_active_in_train_mode_only():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny(dropout=0.3, attention_dropout=0.3))
    ids = torch.randint(5, V, (2, 12))
    model.train()
    a, b = model(ids).nsp_logits, model(ids).nsp_logits
    assert not torch.allclose(a, b)
    model.eval()
    torch.testing.assert_close(model(ids).nsp_logits, model(ids).nsp_logits, atol=0, rtol=0)


def test_sequence_longer_than_max_position_is_a_clear_error():
    model = BertModel(tiny(max_position=16))
    with pytest.raises(BertraceError, match="exceeds max_position 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_flops_per_token_matches_counted_matmul_flops():
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    config = tiny()
    model = BertForPreTraining(config)
    B, T = 4, 24
    ids = torch.randint(5, V, (B, T))
    positions = torch.arange(0, B * T, 6)  # 16 of 96 positions
    with FlopCounterMode(display=False) as counter:
        out = model(ids, masked_positions=positions)
        pretraining_loss(out, torch.zeros(len(positions), dtype=torch.long), torch.zeros(B, dtype=torch.long))[
            0
        ].backward()
    counted = counter.get_total_flops() / (B * T)
    assert flops_per_token(config, T, mlm_fraction=len(positions) / (B * T)) == pytest.approx(counted, rel=1e-9)
    # the HF-style full-sequence head costs more
    assert flops_per_token(config, T, mlm_fraction=1.0) > flops_per_token(config, T)


def test_padded_vocabulary_is_never_input_or_predicted():
    """``pad_vocab_to_multiple_of`` rounds the embedding up (tensor-core shapes for the decoder
    matmul; the gpu profile: 15,774 WordPiece ids -> 15,808); the MLM logits stop at the
    tokenizer's ids, so the padding rows get no gradient, and an unpadded config is unchanged."""
    tiny_params = {"preset": "tiny", "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "max_position": 64}
    assert config_from_params({"preset": "base", "pad_vocab_to_multiple_of": 64}, 15_774).vocab_size == 15_808
    config = config_from_params({**tiny_params, "pad_vocab_to_multiple_of": 8}, 123)
    assert (config.vocab_size, config.tokenizer_vocab_size, config.predicted_vocab_size) == (128, 123, 123)
    assert BertConfig.from_dict(config.to_dict()) == config
    plain = config_from_params(tiny_params, 123)
    assert plain.tokenizer_vocab_size is None and "tokenizer_vocab_size" not in plain.to_dict()  # checkpoints as before
    assert (
        config_from_params({**tiny_params, "pad_vocab_to_multiple_of": 8}, 128).to_dict()
        == config_from_params(tiny_params, 128).to_dict()
    )  # already a multiple: nothing to pad
    for bad in (0, True, "x"):
        with pytest.raises(BertraceError, match="pad_vocab_to_multiple_of"):
            config_from_params({**tiny_params, "pad_vocab_to_multiple_of": bad}, 123)
    with pytest.raises(BertraceError, match="tokenizer_vocab_size comes from the tokenizer"):
        config_from_params({**tiny_params, "tokenizer_vocab_size": 100}, 123)
    with pytest.raises(BertraceError, match="tokenizer_vocab_size must be"):
        BertConfig(vocab_size=64, tokenizer_vocab_size=65)

    torch.manual_seed(0)
    model = BertForPreTraining(config)
    assert model.bert.embeddings.word.weight.shape == (128, 32)
    ids = torch.randint(5, 123, (3, 16))
    positions = torch.tensor([1, 5, 17, 40])
    out = model(ids, masked_positions=positions)
    assert out.mlm_logits.shape == (4, 123)  # never predicted
    labels = torch.tensor([7, 99, 122, 5])
    loss, _, _ = pretraining_loss(out, labels, torch.zeros(3, dtype=torch.long))
    loss.backward()
    grad = model.bert.embeddings.word.weight.grad
    assert grad[123:].abs().sum() == 0 and grad[:123].abs().sum() > 0  # never input, never a target
    assert model.mlm.decoder.bias.grad[123:].abs().sum() == 0


def test_the_written_out_attention_that_trains_on_the_cpu_equals_sdpa():
    """SelfAttention trains on the CPU with attention_written_out and evaluates with SDPA: the same
    outputs and gradients, padding mask included."""
    from pipeline.models.primitives import attention_written_out

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 7, 8, generator=g, requires_grad=True) for _ in range(3))
    mask = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 4:] = False
    mask[2, ..., 1:] = False
    for m in (None, mask):
        ours = attention_written_out(q, k, v, m, 0.0)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        torch.testing.assert_close(ours, ref)
        grads = torch.autograd.grad(ours.square().sum(), (q, k, v))
        ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
        for a, b in zip(grads, ref_grads):
            torch.testing.assert_close(a, b)
    torch.manual_seed(0)
    model = BertForPreTraining(tiny(dropout=0.0, attention_dropout=0.0))
    ids, token_type, attention_mask, positions = batch()
    trained = model(ids, token_type, attention_mask, positions)  # grad enabled: the written-out path
    with torch.no_grad():
        evaluated = model(ids, token_type, attention_mask, positions)  # SDPA
    torch.testing.assert_close(trained.mlm_logits, evaluated.mlm_logits)
    # attention dropout drops probabilities: a training forward differs from the evaluation one
    dropped = BertForPreTraining(tiny(dropout=0.0, attention_dropout=0.5))
    dropped.load_state_dict(model.state_dict())
    assert not torch.allclose(dropped(ids, token_type, attention_mask, positions).mlm_logits, evaluated.mlm_logits)
