"""Hugging Face interoperability of the decoder: ``transformers``' GPT-2 config and names.

The GPT-2 counterpart of ``pipeline/interop/hf.py``, used by the export (``pipeline/interop/export_gpt.py``), the
faithfulness tests (tests/unit/models/test_gpt.py: logits within 1e-5) and bench/bench_gpt.py. Kept out of
``gpt.py`` so that pre-training does not depend on it.

Two differences of layout: HF's GPT-2 uses ``Conv1D`` layers, whose weight is the transpose of
``nn.Linear``'s ([in, out]), and names the modules ``transformer.h.{i}.attn.c_attn`` etc.; the
q/k/v projection is fused in both (``c_attn`` = our ``qkv``), so no splitting is needed.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from pipeline.core.errors import BertraceError
from pipeline.core.formats import SEP_ID
from pipeline.models.bert import BertConfig
from pipeline.models.gpt import GPT, GPTForSequenceClassification


def hf_gpt2_config(config: BertConfig, num_labels: int | None = None, eos_id: int = SEP_ID) -> dict:
    """Fields of ``transformers.GPT2Config`` for this config (``GPT2Config(**hf_gpt2_config(c))``).

    ``eos_id`` (also BOS): the separator that ends a document in the causal examples ([SEP]), so
    ``generate`` stops where ours does."""
    d = {
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.max_position,
        "n_embd": config.hidden_size,
        "n_layer": config.num_layers,
        "n_head": config.num_heads,
        "n_inner": config.intermediate_size,
        # gelu_new is the tanh approximation written out (GPT-2's own); "gelu" the exact erf form
        "activation_function": "gelu_new" if config.gelu == "tanh" else "gelu",
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.attention_dropout,
        "layer_norm_epsilon": config.layer_norm_eps,
        "initializer_range": config.initializer_range,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": config.pad_id,
        "tie_word_embeddings": True,
    }
    if num_labels is not None:
        d["num_labels"] = num_labels
    return d


_HF_GELU = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}


def config_from_hf_gpt2(hf: dict) -> BertConfig:
    """Inverse of ``hf_gpt2_config`` (e.g. for a GPT-2 config.json)."""
    act = hf.get("activation_function", "gelu_new")
    if act not in _HF_GELU:
        raise BertraceError(
            f"HF config: activation_function {act!r} is not supported; expected one of {sorted(_HF_GELU)}"
        )
    for flag, ok in (
        ("scale_attn_by_inverse_layer_idx", False),
        ("reorder_and_upcast_attn", False),
        ("scale_attn_weights", True),
        ("add_cross_attention", False),
    ):
        if hf.get(flag, ok) != ok:
            raise BertraceError(f"HF config: {flag}={hf[flag]!r} is not supported (GPT-2 uses {ok})")
    H = hf["n_embd"]
    return BertConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=H,
        num_layers=hf["n_layer"],
        num_heads=hf["n_head"],
        intermediate_size=hf.get("n_inner") or 4 * H,
        max_position=hf.get("n_positions", 1024),
        dropout=hf.get("resid_pdrop", 0.1),
        attention_dropout=hf.get("attn_pdrop", 0.1),
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        initializer_range=hf.get("initializer_range", 0.02),
        gelu=_HF_GELU[act],
        pad_id=hf.get("pad_token_id") or 0,
    )


def _name_map(config: BertConfig, ours: str, hf: str) -> list[tuple[str, str, bool]]:
    """(our name, HF name, transposed) for a GPT's parameters (``lm_head`` is the tied ``wte``)."""
    pairs = [
        ("wte.weight", "wte.weight", False),
        ("wpe.weight", "wpe.weight", False),
        ("ln_f.weight", "ln_f.weight", False),
        ("ln_f.bias", "ln_f.bias", False),
    ]
    for i in range(config.num_layers):
        o, h = f"blocks.{i}.", f"h.{i}."
        for ln in ("ln_1", "ln_2"):
            pairs += [(f"{o}{ln}.{wb}", f"{h}{ln}.{wb}", False) for wb in ("weight", "bias")]
        for a, b in (
            ("attn.qkv", "attn.c_attn"),
            ("attn.proj", "attn.c_proj"),
            ("mlp.fc", "mlp.c_fc"),
            ("mlp.proj", "mlp.c_proj"),
        ):
            pairs += [(f"{o}{a}.weight", f"{h}{b}.weight", True), (f"{o}{a}.bias", f"{h}{b}.bias", False)]
    return [(ours + a, hf + b, t) for a, b, t in pairs]


def _name_maps(model: nn.Module) -> tuple[list[tuple[str, str, bool]], dict[str, str]]:
    """(pairs, tied HF aliases {hf name: hf name it equals}) for GPT or GPTForSequenceClassification."""
    if isinstance(model, GPT):
        return _name_map(model.config, "", "transformer."), {"lm_head.weight": "transformer.wte.weight"}
    if isinstance(model, GPTForSequenceClassification):
        return _name_map(model.config, "gpt.", "transformer.") + [("score.weight", "score.weight", False)], {}
    raise BertraceError(f"HF GPT-2 mapping: unsupported model type {type(model).__name__}")


def to_hf_gpt2_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """State dict in ``transformers`` names: GPT -> ``GPT2LMHeadModel``, GPTForSequenceClassification
    -> ``GPT2ForSequenceClassification`` (strict load). Detached contiguous copies."""
    ours = model.state_dict()
    pairs, tied = _name_maps(model)
    out = {}
    for o, hf, transposed in pairs:
        t = ours[o].detach()
        out[hf] = (t.t() if transposed else t).clone().contiguous()
    for alias, target in tied.items():
        out[alias] = out[target].clone()
    return out


def load_hf_gpt2_state_dict(model: nn.Module, hf_sd: dict, strict: bool = True, source: str = "HF checkpoint") -> None:
    """Copy a ``transformers`` GPT-2 state dict into ``model`` (inverse of ``to_hf_gpt2_state_dict``).

    ``lm_head.weight`` may be absent (tied). With ``strict`` unexpected keys are an error (e.g. an
    LM head when loading a classifier: pass ``strict=False``); missing keys always are."""
    pairs, tied = _name_maps(model)
    ignorable = set(tied) | {
        f"transformer.h.{i}.attn.{b}" for i in range(model.config.num_layers) for b in ("bias", "masked_bias")
    }  # old transformers' causal-mask buffers
    needed = [hf for _, hf, _ in pairs]
    missing = [k for k in needed if k not in hf_sd]
    unexpected = sorted(set(hf_sd) - set(needed) - ignorable)
    if missing or (strict and unexpected):
        raise BertraceError(
            f"{source}: state dict does not fit {type(model).__name__} (missing {missing[:8]}, "
            f"unexpected {unexpected[:8]}); check the model class and config"
        )
    own = model.state_dict()
    new = {o: (hf_sd[hf].t() if transposed else hf_sd[hf]) for o, hf, transposed in pairs}
    bad = [f"{k}: {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in new.items() if v.shape != own[k].shape]
    if bad:
        raise BertraceError(f"{source}: weight shapes differ from the model config ({bad[:4]}); use its config")
    with torch.no_grad():
        for k, v in new.items():
            own[k].copy_(v)
