"""Hugging Face interoperability: config fields and state-dict names of ``transformers``' BERT.

Used by export (``bertrace export --hf``), the faithfulness tests and the benchmark; kept out of
``model.py`` so that the pre-training stage does not depend on it (editing the conversion reruns
no stage). tests/test_model.py checks logits against ``transformers`` to 1e-5 through these maps.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from pipeline.errors import BertraceError
from pipeline.model import BertConfig, BertForPreTraining, BertForSequenceClassification, BertModel

def hf_config(config: BertConfig, num_labels: int | None = None) -> dict:
    """Fields of ``transformers.BertConfig`` for this config (``BertConfig(**hf_config(c))``)."""
    d = {
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        # gelu_pytorch_tanh is F.gelu(approximate="tanh"): exactly our op ("gelu_new" is the same
        # formula written out); "gelu" is the exact erf form.
        "hidden_act": "gelu_pytorch_tanh" if config.gelu == "tanh" else "gelu",
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_position,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_id,
    }
    if num_labels is not None:
        d["num_labels"] = num_labels
    return d


_HF_GELU = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}


def config_from_hf(hf: dict) -> BertConfig:
    """Inverse of ``hf_config`` (e.g. for a downloaded config.json)."""
    act = hf.get("hidden_act", "gelu")
    if act not in _HF_GELU:
        raise BertraceError(f"HF config: hidden_act {act!r} is not supported; expected one of {sorted(_HF_GELU)}")
    return BertConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
        max_position=hf.get("max_position_embeddings", 512), type_vocab_size=hf.get("type_vocab_size", 2),
        dropout=hf.get("hidden_dropout_prob", 0.1), attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12), initializer_range=hf.get("initializer_range", 0.02),
        gelu=_HF_GELU[act], pad_id=hf.get("pad_token_id", 0) or 0,
    )


def _encoder_name_map(config: BertConfig, ours: str, hf: str) -> list[tuple[str, str]]:
    """(our name, HF name) pairs for a BertModel, except the fused qkv (see _qkv_names)."""
    pairs = [
        ("embeddings.word.weight", "embeddings.word_embeddings.weight"),
        ("embeddings.position.weight", "embeddings.position_embeddings.weight"),
        ("embeddings.segment.weight", "embeddings.token_type_embeddings.weight"),
        ("embeddings.ln.weight", "embeddings.LayerNorm.weight"),
        ("embeddings.ln.bias", "embeddings.LayerNorm.bias"),
        ("pooler.weight", "pooler.dense.weight"),
        ("pooler.bias", "pooler.dense.bias"),
    ]
    for i in range(config.num_layers):
        o, h = f"layers.{i}.", f"encoder.layer.{i}."
        for wb in ("weight", "bias"):
            pairs += [
                (f"{o}attn.proj.{wb}", f"{h}attention.output.dense.{wb}"),
                (f"{o}ln_attn.{wb}", f"{h}attention.output.LayerNorm.{wb}"),
                (f"{o}ffn.fc.{wb}", f"{h}intermediate.dense.{wb}"),
                (f"{o}ffn.proj.{wb}", f"{h}output.dense.{wb}"),
                (f"{o}ln_ffn.{wb}", f"{h}output.LayerNorm.{wb}"),
            ]
    return [(ours + a, hf + b) for a, b in pairs]


def _qkv_names(config: BertConfig, ours: str, hf: str) -> list[tuple[str, tuple[str, str, str]]]:
    out = []
    for i in range(config.num_layers):
        for wb in ("weight", "bias"):
            h = f"{hf}encoder.layer.{i}.attention.self."
            out.append((f"{ours}layers.{i}.attn.qkv.{wb}", tuple(f"{h}{n}.{wb}" for n in ("query", "key", "value"))))
    return out


def _name_maps(model: nn.Module):
    """(plain pairs, qkv pairs, tied HF aliases {hf name: hf name it equals}) for a model."""
    if isinstance(model, BertForPreTraining):
        pairs = _encoder_name_map(model.config, "bert.", "bert.")
        pairs += [
            ("mlm.dense.weight", "cls.predictions.transform.dense.weight"),
            ("mlm.dense.bias", "cls.predictions.transform.dense.bias"),
            ("mlm.ln.weight", "cls.predictions.transform.LayerNorm.weight"),
            ("mlm.ln.bias", "cls.predictions.transform.LayerNorm.bias"),
            ("mlm.decoder.bias", "cls.predictions.bias"),
            ("nsp.weight", "cls.seq_relationship.weight"),
            ("nsp.bias", "cls.seq_relationship.bias"),
        ]
        tied = {
            "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
            "cls.predictions.decoder.bias": "cls.predictions.bias",
        }
        return pairs, _qkv_names(model.config, "bert.", "bert."), tied
    if isinstance(model, BertForSequenceClassification):
        pairs = _encoder_name_map(model.config, "bert.", "bert.")
        pairs += [("classifier.weight", "classifier.weight"), ("classifier.bias", "classifier.bias")]
        return pairs, _qkv_names(model.config, "bert.", "bert."), {}
    if isinstance(model, BertModel):
        return _encoder_name_map(model.config, "", ""), _qkv_names(model.config, "", ""), {}
    raise BertraceError(f"HF mapping: unsupported model type {type(model).__name__}")


def to_hf_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """State dict in Hugging Face names for BertForPreTraining, BertForSequenceClassification or
    BertModel; loads strictly into the matching ``transformers`` class. Tensors are detached
    contiguous copies (tied entries included, as HF's own ``state_dict()`` has them)."""
    ours = model.state_dict()
    pairs, qkv, tied = _name_maps(model)
    out = {hf: ours[o].detach().clone().contiguous() for o, hf in pairs}
    for o, hf_names in qkv:
        for hf, part in zip(hf_names, ours[o].chunk(3, dim=0)):
            out[hf] = part.detach().clone().contiguous()
    for alias, target in tied.items():
        out[alias] = out[target].clone()
    return out


def load_hf_state_dict(model: nn.Module, hf_sd: dict, strict: bool = True, source: str = "HF checkpoint") -> None:
    """Copy a Hugging Face state dict into ``model`` (inverse of ``to_hf_state_dict``).

    Tied entries (``cls.predictions.decoder.*``) may be absent. With ``strict`` unexpected keys
    are an error (with ``strict=False`` they are ignored, e.g. the heads of a BertForPreTraining
    checkpoint when loading a BertForSequenceClassification); missing keys always are.
    """
    pairs, qkv, tied = _name_maps(model)
    ignorable = set(tied) | {"bert.embeddings.position_ids", "embeddings.position_ids",
                             "bert.embeddings.token_type_ids", "embeddings.token_type_ids"}
    needed = [hf for _, hf in pairs] + [hf for _, names in qkv for hf in names]
    missing = [k for k in needed if k not in hf_sd]
    unexpected = sorted(set(hf_sd) - set(needed) - ignorable)
    if missing or (strict and unexpected):
        raise BertraceError(
            f"{source}: state dict does not fit {type(model).__name__} (missing {missing[:8]}, "
            f"unexpected {unexpected[:8]}); check the model class and config"
        )
    new = {o: hf_sd[hf] for o, hf in pairs}
    for o, names in qkv:
        new[o] = torch.cat([hf_sd[n] for n in names], dim=0)
    own = model.state_dict()
    bad = [f"{k}: {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in new.items() if v.shape != own[k].shape]
    if bad:
        raise BertraceError(f"{source}: weight shapes differ from the model config ({bad[:4]}); use its config")
    with torch.no_grad():
        for k, v in new.items():
            own[k].copy_(v)
