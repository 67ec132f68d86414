"""pipeline.models.gpt: the causal property, faithfulness to Hugging Face's GPT-2 (LM and sequence
classification), the key/value cache, init, weight tying, the flat-row gather, FLOP count and
the HF name mapping in both directions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.core.errors import BertraceError
from pipeline.interop.hf_gpt import config_from_hf_gpt2, hf_gpt2_config, load_hf_gpt2_state_dict, to_hf_gpt2_state_dict
from pipeline.models.bert import BertConfig, BertForPreTraining, num_parameters
from pipeline.models.gpt import (
    GPT,
    GPTForSequenceClassification,
    causal_lm_loss,
    decoder_flops_per_token,
    last_token_rows,
)
from tests.support.weights import randomize

V = 211  # tiny vocabulary: these tests are about the math, not the size


def tiny(**kw) -> BertConfig:
    d = dict(
        vocab_size=V,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        intermediate_size=64,
        max_position=64,
        layer_norm_eps=1e-5,
    )
    d.update(kw)
    return BertConfig(**d)


def batch(B=4, T=24, seed=0):
    """Random ids, right padding ([PAD] = 0) on some rows, and the attention mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    lengths = [T, T - 7, T - 1, 9][:B]
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = 0
    return ids, mask


# --------------------------------------------------------------------------------------------
# The causal property


@pytest.mark.parametrize("t", [0, 7, 23])
def test_changing_a_future_token_changes_no_earlier_logits_exactly(t):
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    randomize(model, 3)
    ids, _ = batch(B=2, T=24)
    changed = ids.clone()
    changed[:, t] = (changed[:, t] + 17) % V
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    assert torch.equal(a[:, :t], b[:, :t])  # bit for bit, not merely close
    assert (a[:, t:] - b[:, t:]).abs().amax(dim=(0, 2)).min() > 0  # position t on all see the change


def test_right_padding_changes_no_real_token_logits():
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    ids, mask = batch()
    with torch.no_grad():
        full = model(ids, mask).logits
        for b in range(ids.size(0)):
            n = int(mask[b].sum())
            alone = model(ids[b : b + 1, :n]).logits[0]
            torch.testing.assert_close(full[b, :n], alone, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------------
# Faithfulness: same weights, same inputs -> the same logits as transformers


def _hf_lm(config: BertConfig, hf_act: str | None = None):
    transformers = pytest.importorskip("transformers")
    fields = hf_gpt2_config(config)
    if hf_act is not None:
        fields["activation_function"] = hf_act
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**fields)).eval()
    randomize(hf, seed=1)
    ours = GPT(config).eval()
    load_hf_gpt2_state_dict(ours, hf.state_dict())
    return ours, hf


@pytest.mark.parametrize("gelu,hf_act", [("exact", "gelu"), ("tanh", "gelu_new"), ("tanh", "gelu_pytorch_tanh")])
def test_logits_equal_transformers_gpt2(gelu, hf_act):
    ours, hf = _hf_lm(tiny(gelu=gelu), hf_act)
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # HF ties too
    ids, mask = batch()
    with torch.no_grad():
        a = ours(ids, mask).logits
        b = hf(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    assert a.shape == b.shape == (4, 24, V)
    torch.testing.assert_close(a[valid], b[valid], atol=1e-5, rtol=0)
    # and the loss: HF shifts labels by one inside, as causal_lm_loss does
    labels = ids.masked_fill(~valid, -100)
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
    torch.testing.assert_close(causal_lm_loss(a, labels), theirs, atol=1e-5, rtol=0)


def test_wrong_activation_pairing_is_detected():
    """The exact and tanh GELUs differ enough here that a swapped config would fail the test above."""
    ours, hf = _hf_lm(tiny(gelu="tanh"), "gelu")
    ids, _ = batch()
    with torch.no_grad():
        assert (ours(ids).logits - hf(input_ids=ids).logits).abs().max() > 1e-4


def test_hf_mapping_round_trips_and_config_inverts():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tiny(gelu="exact", dropout=0.05, attention_dropout=0.02, pad_id=0)
    ours = GPT(config)
    randomize(ours, 5)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**hf_gpt2_config(config)))
    result = hf.load_state_dict(to_hf_gpt2_state_dict(ours), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    back = GPT(config)
    load_hf_gpt2_state_dict(back, hf.state_dict())
    for k, v in ours.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k
    again = config_from_hf_gpt2(hf.config.to_dict())
    assert again.to_dict() == {**config.to_dict(), "type_vocab_size": again.type_vocab_size}
    with pytest.raises(BertraceError, match=r"missing \['transformer.h.0.attn.c_attn.weight'"):
        sd = hf.state_dict()
        del sd["transformer.h.0.attn.c_attn.weight"]
        load_hf_gpt2_state_dict(GPT(config), sd)
    with pytest.raises(BertraceError, match="scale_attn_by_inverse_layer_idx"):
        config_from_hf_gpt2({**hf.config.to_dict(), "scale_attn_by_inverse_layer_idx": True})


def _hf_classifier(config: BertConfig, num_labels: int = 3):
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2ForSequenceClassification(
        transformers.GPT2Config(**hf_gpt2_config(config, num_labels=num_labels))
    ).eval()
    randomize(hf, seed=2)
    ours = GPTForSequenceClassification(config, num_labels).eval()
    load_hf_gpt2_state_dict(ours, hf.state_dict())
    return ours, hf


def test_classifier_equals_transformers_gpt2_for_sequence_classification():
    """Last real token's hidden state -> score (no bias), on a right-padded batch: HF finds the
    last non-[PAD] id, we use the attention mask; both read the same position."""
    ours, hf = _hf_classifier(tiny())
    ids, mask = batch()
    with torch.no_grad():
        a = ours(ids, None, mask)
        b = hf(input_ids=ids, attention_mask=mask).logits
    assert a.shape == (4, 3)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # and it is the last real token's LM hidden state
    with torch.no_grad():
        hidden = ours.gpt(ids).hidden
    last = mask.sum(1) - 1
    torch.testing.assert_close(a, ours.score(hidden[torch.arange(4), last]), atol=1e-6, rtol=0)
    # round trip through HF names
    sd = to_hf_gpt2_state_dict(ours)
    assert set(sd) == set(hf.state_dict())


def test_classifier_loads_a_pretrained_decoder_strictly():
    torch.manual_seed(0)
    config = tiny()
    lm = GPT(config)
    randomize(lm, 4)
    clf = GPTForSequenceClassification(config, 2)
    clf.load_pretrained_decoder({f"_orig_mod.{k}": v for k, v in lm.state_dict().items()})  # compiled prefix
    for k, v in lm.state_dict().items():
        assert torch.equal(clf.gpt.state_dict()[k], v)
    sd = dict(lm.state_dict())
    del sd["blocks.1.mlp.fc.bias"]
    sd["extra.weight"] = torch.zeros(1)
    with pytest.raises(BertraceError, match=r"missing \['blocks.1.mlp.fc.bias'\].*unexpected \['extra.weight'\]"):
        clf.load_pretrained_decoder(sd, source="data/pretrain/best.pt")
    with pytest.raises(BertraceError, match="pretrain.objective: clm"):
        clf.load_pretrained_decoder(BertForPreTraining(config).state_dict(), source="best.pt")
    with pytest.raises(BertraceError, match="shapes differ"):
        GPTForSequenceClassification(tiny(hidden_size=64), 2).load_pretrained_decoder(lm.state_dict())


def test_last_token_rows():
    ids, mask = batch()
    assert last_token_rows(ids, mask).tolist() == [23, 24 + 16, 48 + 22, 72 + 8]
    assert last_token_rows(ids, None).tolist() == [23, 47, 71, 95]


# --------------------------------------------------------------------------------------------
# Key/value cache


def test_kv_cache_decoding_equals_full_recomputation():
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    randomize(model, 6)
    ids = torch.randint(5, V, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids).logits
        # a 5-token prompt, then one token at a time, then a 4-token chunk (the masked cache path)
        out = model(ids[:, :5], use_cache=True)
        steps, past = [out.logits], out.past_key_values
        for t in range(5, 16):
            out = model(ids[:, t : t + 1], past_key_values=past, use_cache=True)
            steps.append(out.logits)
            past = out.past_key_values
        out = model(ids[:, 16:20], past_key_values=past, use_cache=True)
        steps.append(out.logits)
    assert len(out.past_key_values) == 2 and out.past_key_values[0][0].shape == (2, 4, 20, 8)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_max_position_is_a_clear_error_with_and_without_cache():
    model = GPT(tiny(max_position=8)).eval()
    with pytest.raises(BertraceError, match="exceeds max_position 8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with torch.no_grad():
        past = model(torch.zeros(1, 8, dtype=torch.long), use_cache=True).past_key_values
    with pytest.raises(BertraceError, match="sequence length 9 exceeds max_position 8"):
        model(torch.zeros(1, 1, dtype=torch.long), past_key_values=past)


# --------------------------------------------------------------------------------------------
# Init, tying, rows, padded vocabulary, FLOPs


def test_init_ties_the_head_and_scales_residual_projections():
    torch.manual_seed(0)
    config = tiny(hidden_size=256, num_heads=4, intermediate_size=1024, num_layers=8, vocab_size=2000)
    model = GPT(config)
    assert model.lm_head.weight is model.wte.weight
    assert num_parameters(model) == sum(p.numel() for n, p in model.state_dict().items() if n != "lm_head.weight")
    std = 0.02 / math.sqrt(2 * 8)
    for name, p in model.named_parameters():
        if name.endswith(("attn.proj.weight", "mlp.proj.weight")):
            assert p.std().item() == pytest.approx(std, rel=0.05), name
        elif name.endswith(("qkv.weight", "fc.weight", "wte.weight", "wpe.weight")):
            assert p.std().item() == pytest.approx(0.02, rel=0.05), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name
    # the tie holds through training: one Parameter, one gradient
    ids, _ = batch()
    causal_lm_loss(model(ids).logits, ids).backward()
    assert model.lm_head.weight.grad is model.wte.weight.grad


def test_rows_equal_the_full_outputs_at_those_rows():
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    ids, mask = batch()
    rows = torch.tensor([0, 5, 30, 95])
    with torch.no_grad():
        full = model(ids, mask)
        part = model(ids, mask, rows=rows)
    assert part.logits.shape == (4, V) and part.hidden.shape == (4, 32)
    torch.testing.assert_close(part.logits, full.logits.reshape(-1, V)[rows], atol=1e-6, rtol=0)
    torch.testing.assert_close(part.hidden, full.hidden.reshape(-1, 32)[rows], atol=1e-6, rtol=0)
    with pytest.raises(BertraceError, match="1-D flat indices"):
        model(ids, rows=rows.view(2, 2))


def test_padded_vocabulary_is_never_predicted():
    config = tiny(vocab_size=256, tokenizer_vocab_size=V)
    model = GPT(config).eval()
    ids, _ = batch()
    assert model(ids).logits.shape == (4, 24, V)
    assert model.wte.weight.shape == (256, 32)


def test_causal_lm_loss_shifts_by_one_and_ignores():
    logits = torch.full((1, 4, 5), -30.0)
    ids = torch.tensor([[1, 2, 3, 4]])
    for t, nxt in enumerate([2, 3, 4]):
        logits[0, t, nxt] = 30.0  # each position predicts the next token perfectly
    assert causal_lm_loss(logits, ids).item() == pytest.approx(0.0, abs=1e-6)
    logits[0, 2, 4], logits[0, 2, 0] = -30.0, 30.0  # the last prediction is now wrong ...
    assert causal_lm_loss(logits, ids).item() > 10
    ignored = torch.tensor([[1, 2, 3, -100]])  # ... unless its target is ignored
    assert causal_lm_loss(logits, ignored).item() == pytest.approx(0.0, abs=1e-6)


def test_fused_head_and_loss_equal_logits_then_cross_entropy():
    """linear_cross_entropy (chunks that do not divide the rows, ignored targets) gives the loss and
    the gradients of F.cross_entropy(hidden @ W.T): to float32 rounding in float32, to bfloat16's
    under autocast; GPT(targets=...) trains through it and returns no logits."""
    from pipeline.models.primitives import linear_cross_entropy

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=g, requires_grad=True)
    weight = torch.randn(V, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (37,), generator=g)
    targets[[3, 20]] = -100
    ref = F.cross_entropy(hidden @ weight.t(), targets)
    ref_grads = torch.autograd.grad(ref * 2.5, (hidden, weight))  # a non-unit upstream gradient
    fused = linear_cross_entropy(hidden, weight, targets, chunk=8)
    grads = torch.autograd.grad(fused * 2.5, (hidden, weight))
    assert fused.item() == pytest.approx(ref.item(), rel=1e-6)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_bf16 = F.cross_entropy((hidden @ weight.t()).float(), targets)
        fused_bf16 = linear_cross_entropy(hidden, weight, targets, chunk=8)
    assert fused_bf16.dtype == torch.float32
    assert fused_bf16.item() == pytest.approx(ref_bf16.item(), rel=1e-3)
    assert torch.autograd.grad(fused_bf16, hidden)[0].dtype == torch.float32  # the input's dtype

    torch.manual_seed(0)
    model = GPT(tiny()).eval()  # no dropout; autograd still records
    ids, _ = batch()
    rows = (torch.arange(4)[:, None] * 24 + torch.arange(23)[None, :]).reshape(-1)
    out = model(ids, rows=rows, targets=ids[:, 1:].reshape(-1))
    assert out.logits is None
    out.loss.backward()
    fused_grad = model.wte.weight.grad.clone()
    model.zero_grad()
    causal_lm_loss(model(ids).logits, ids).backward()
    torch.testing.assert_close(fused_grad, model.wte.weight.grad, rtol=1e-4, atol=1e-6)
    with torch.no_grad():  # no autograd: the logits are returned with the loss
        evaluated = model(ids, rows=rows, targets=ids[:, 1:].reshape(-1))
    assert evaluated.logits.shape == (4 * 23, V) and evaluated.loss.item() == pytest.approx(out.loss.item(), rel=1e-5)


def test_flops_per_token_matches_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    config = tiny()
    model = GPT(config)
    B, T = 4, 24
    ids = torch.randint(5, V, (B, T))
    with FlopCounterMode(display=False) as counter:
        causal_lm_loss(model(ids).logits, ids).backward()
    counted = counter.get_total_flops() / (B * T)
    assert decoder_flops_per_token(config, T) == pytest.approx(counted, rel=1e-9)
