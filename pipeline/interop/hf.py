"""Hugging Face interoperability: config fields and state-dict names of ``transformers``' BERT.

Used by export (``bertrace export --hf``), the faithfulness tests and the benchmark; kept out of
``model.py`` so that the pre-training stage does not depend on it (editing the conversion reruns
no stage). tests/unit/models/test_model.py checks logits against ``transformers`` to 1e-5 through these maps.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from pipeline.core.errors import BertraceError
from pipeline.models.bert import (
    BertConfig,
    BertForPreTraining,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from pipeline.models.electra import DiscriminatorHead, ElectraForPreTraining


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
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        max_position=hf.get("max_position_embeddings", 512),
        type_vocab_size=hf.get("type_vocab_size", 2),
        dropout=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        initializer_range=hf.get("initializer_range", 0.02),
        gelu=_HF_GELU[act],
        pad_id=hf.get("pad_token_id", 0) or 0,
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
    if isinstance(model, BertForTokenClassification):  # transformers' has no pooler (add_pooling_layer=False)
        pairs = [
            (o, h) for o, h in _encoder_name_map(model.config, "bert.", "bert.") if not o.startswith("bert.pooler.")
        ]
        pairs += [("classifier.weight", "classifier.weight"), ("classifier.bias", "classifier.bias")]
        return pairs, _qkv_names(model.config, "bert.", "bert."), {}
    if isinstance(model, BertForSequenceClassification):
        pairs = _encoder_name_map(model.config, "bert.", "bert.")
        pairs += [("classifier.weight", "classifier.weight"), ("classifier.bias", "classifier.bias")]
        return pairs, _qkv_names(model.config, "bert.", "bert."), {}
    if isinstance(model, BertModel):
        return _encoder_name_map(model.config, "", ""), _qkv_names(model.config, "", ""), {}
    raise BertraceError(f"HF mapping: unsupported model type {type(model).__name__}")


def hf_state_dict_names(model: nn.Module) -> tuple[list[str], set[str]]:
    """``(needed, ignorable)``: the Hugging Face state-dict names ``model`` is built from, and the
    ones a checkpoint may carry beside them (tied aliases, position/token-type id buffers).
    Used by ``pipeline.interop.hf_import`` to name the missing and unexpected keys of a foreign checkpoint."""
    pairs, qkv, tied = _name_maps(model)
    needed = [hf for _, hf in pairs] + [hf for _, names in qkv for hf in names]
    ignorable = set(tied) | {
        "bert.embeddings.position_ids",
        "embeddings.position_ids",
        "bert.embeddings.token_type_ids",
        "embeddings.token_type_ids",
    }
    return needed, ignorable


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
    ignorable = set(tied) | {
        "bert.embeddings.position_ids",
        "embeddings.position_ids",
        "bert.embeddings.token_type_ids",
        "embeddings.token_type_ids",
    }
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


# --------------------------------------------------------------------------------------------
# ELECTRA (Clark et al. 2020): transformers' ElectraForPreTraining (discriminator),
# ElectraForMaskedLM (generator) and ElectraForSequenceClassification. The encoder layers are
# named as BERT's under ``electra.``; there is no pooler, and ``embeddings_project`` maps narrower
# embeddings to the hidden size. Our ELECTRA model is pipeline/models/electra.py.

_ELECTRA_IGNORABLE = {
    "electra.embeddings.position_ids",
    "electra.embeddings.token_type_ids",
    "embeddings.position_ids",
    "embeddings.token_type_ids",
    "generator_lm_head.weight",
}


def electra_hf_config(config: BertConfig, num_labels: int | None = None) -> dict:
    """Fields of ``transformers.ElectraConfig`` for our encoder config (``embedding_size`` included)."""
    d = hf_config(config, num_labels)
    d["model_type"] = "electra"
    d["embedding_size"] = config.embedding_dim
    return d


def _electra_encoder_pairs(config: BertConfig, ours: str, hf: str, embeddings: bool = True) -> list[tuple[str, str]]:
    pairs = [
        (o, h)
        for o, h in _encoder_name_map(config, ours, hf)
        if not o.startswith(ours + "pooler.") and (embeddings or not o.startswith(ours + "embeddings."))
    ]
    if config.embedding_dim != config.hidden_size:
        pairs += [(f"{ours}embeddings_project.{wb}", f"{hf}embeddings_project.{wb}") for wb in ("weight", "bias")]
    return pairs


def _electra_maps(model: nn.Module, part: str):
    """(plain pairs, qkv pairs, tied HF aliases) for ``part``: "discriminator" or "generator" of
    our ElectraForPreTraining, or "classifier" (BertForSequenceClassification with ELECTRA's head)."""

    if part in ("discriminator", "generator") and not isinstance(model, ElectraForPreTraining):
        raise BertraceError(
            f"HF ELECTRA mapping: the {part} needs our ElectraForPreTraining, got {type(model).__name__}"
        )
    if part == "discriminator":
        pairs = _electra_encoder_pairs(model.config, "bert.", "electra.")
        pairs += [(f"disc_head.dense.{wb}", f"discriminator_predictions.dense.{wb}") for wb in ("weight", "bias")]
        pairs += [
            (f"disc_head.prediction.{wb}", f"discriminator_predictions.dense_prediction.{wb}")
            for wb in ("weight", "bias")
        ]
        return pairs, _qkv_names(model.config, "bert.", "electra."), {}
    if part == "generator":
        pairs = [
            (o, h) for o, h in _encoder_name_map(model.config, "bert.", "electra.") if o.startswith("bert.embeddings.")
        ]  # shared with the discriminator
        pairs += _electra_encoder_pairs(model.gen_config, "generator.", "electra.", embeddings=False)
        pairs += [
            ("gen_head.dense.weight", "generator_predictions.dense.weight"),
            ("gen_head.dense.bias", "generator_predictions.dense.bias"),
            ("gen_head.ln.weight", "generator_predictions.LayerNorm.weight"),
            ("gen_head.ln.bias", "generator_predictions.LayerNorm.bias"),
            ("gen_head.decoder.bias", "generator_lm_head.bias"),
        ]
        return (
            pairs,
            _qkv_names(model.gen_config, "generator.", "electra."),
            {"generator_lm_head.weight": "electra.embeddings.word_embeddings.weight"},
        )
    if part == "classifier":
        if not isinstance(model, BertForSequenceClassification) or model.config.pooler_activation != "gelu":
            raise BertraceError(
                "HF ELECTRA mapping: a classifier needs ELECTRA's head (model config "
                "pooler_activation: gelu, as fine-tuning an electra checkpoint gives)"
            )
        pairs = _electra_encoder_pairs(model.config, "bert.", "electra.")
        pairs += [(f"bert.pooler.{wb}", f"classifier.dense.{wb}") for wb in ("weight", "bias")]
        pairs += [(f"classifier.{wb}", f"classifier.out_proj.{wb}") for wb in ("weight", "bias")]
        return pairs, _qkv_names(model.config, "bert.", "electra."), {}
    raise BertraceError(f"HF ELECTRA mapping: part must be discriminator, generator or classifier, got {part!r}")


def to_hf_electra_state_dict(model: nn.Module, part: str = "discriminator") -> dict[str, torch.Tensor]:
    """State dict in transformers' names: ``part`` "discriminator" -> ElectraForPreTraining,
    "generator" -> ElectraForMaskedLM (of our ElectraForPreTraining), "classifier" ->
    ElectraForSequenceClassification (of a BertForSequenceClassification with ELECTRA's head)."""
    ours = model.state_dict()
    pairs, qkv, tied = _electra_maps(model, part)
    out = {hf: ours[o].detach().clone().contiguous() for o, hf in pairs}
    for o, hf_names in qkv:
        for hf, part_w in zip(hf_names, ours[o].chunk(3, dim=0)):
            out[hf] = part_w.detach().clone().contiguous()
    for alias, target in tied.items():
        out[alias] = out[target].clone()
    return out


def load_hf_electra_state_dict(
    model: nn.Module, hf_sd: dict, part: str = "discriminator", strict: bool = True, source: str = "HF checkpoint"
) -> None:
    """Copy a transformers ELECTRA state dict into ``model`` (inverse of ``to_hf_electra_state_dict``).
    For our ElectraForPreTraining call it with the discriminator's and then the generator's
    (the embeddings are shared: the one loaded last wins)."""
    pairs, qkv, tied = _electra_maps(model, part)
    needed = [hf for _, hf in pairs] + [hf for _, names in qkv for hf in names]
    missing = [k for k in needed if k not in hf_sd]
    unexpected = sorted(set(hf_sd) - set(needed) - set(tied) - _ELECTRA_IGNORABLE)
    if missing or (strict and unexpected):
        raise BertraceError(
            f"{source}: state dict does not fit the ELECTRA {part} (missing {missing[:8]}, "
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


def electra_hf_names(config: BertConfig) -> list[str]:
    """The transformers names :func:`electra_state_dict_from_hf` reads for ``config`` (the encoder under
    ``electra.`` and the discriminator head): ``pipeline.interop.hf_import`` names a checkpoint's other keys."""
    names = [h for _, h in _electra_encoder_pairs(config, "", "electra.")]
    names += [h for _, hs in _qkv_names(config, "", "electra.") for h in hs]
    return names + [
        f"discriminator_predictions.{n}.{wb}" for n in ("dense", "dense_prediction") for wb in ("weight", "bias")
    ]


def electra_config_from_hf(hf: dict) -> BertConfig:
    """Our encoder config for a transformers ``ElectraConfig`` (dict or object): ELECTRA's
    ``embedding_size`` and classification head (``pooler_activation: gelu``)."""
    if hasattr(hf, "to_dict"):
        hf = hf.to_dict()
    base = config_from_hf(hf)
    d = base.to_dict()
    emb = hf.get("embedding_size") or hf["hidden_size"]
    d.update(embedding_size=None if emb == hf["hidden_size"] else int(emb), pooler_activation="gelu")
    return BertConfig.from_dict(d)


def electra_state_dict_from_hf(hf_state_dict: dict, hf_config) -> tuple[BertConfig, dict[str, torch.Tensor]]:
    """A published ELECTRA discriminator (transformers ``ElectraForPreTraining`` /
    ``ElectraModel`` / ``ElectraForSequenceClassification`` state dict and its config, dict or
    ``ElectraConfig``) as ``(our BertConfig, state dict)``: the encoder under ``bert.*``, which
    ``BertForSequenceClassification.load_pretrained_encoder`` loads, and the replaced-token head
    under ``disc_head.*`` when the checkpoint has it.

    ELECTRA has no pooler; ``bert.pooler`` is the dense layer of ELECTRA's classification head
    (``pooler_activation: gelu``), freshly initialised as transformers does for
    ElectraForSequenceClassification: N(0, initializer_range) from a generator seeded 0 (so an
    import is the same bytes every time), zero bias. A generator checkpoint (ElectraForMaskedLM)
    loads too (its encoder; the MLM head is dropped), as transformers allows."""

    config = electra_config_from_hf(hf_config)
    sd = dict(hf_state_dict)
    if not any(k.startswith("electra.") for k in sd):  # a bare ElectraModel
        sd = {
            ("electra." + k if k.startswith(("embeddings.", "embeddings_project.", "encoder.")) else k): v
            for k, v in sd.items()
        }
    encoder = BertModel(config)
    names = _electra_encoder_pairs(config, "", "electra.")
    qkv = _qkv_names(config, "", "electra.")
    needed = [h for _, h in names] + [h for _, hs in qkv for h in hs]
    missing = [k for k in needed if k not in sd]
    if missing:
        raise BertraceError(
            f"HF ELECTRA checkpoint: missing {missing[:8]}; is it an ELECTRA model with this config "
            f"({config.num_layers} layers, hidden {config.hidden_size})?"
        )
    out: dict[str, torch.Tensor] = {}
    own = encoder.state_dict()
    for o, h in names:
        out["bert." + o] = sd[h].detach().clone()
    for o, hs in qkv:
        out["bert." + o] = torch.cat([sd[h] for h in hs], dim=0).detach().clone()
    bad = [f"{k}: {tuple(v.shape)} vs {tuple(own[k[5:]].shape)}" for k, v in out.items() if v.shape != own[k[5:]].shape]
    if bad:
        raise BertraceError(f"HF ELECTRA checkpoint: weight shapes differ from its config ({bad[:4]})")
    g = torch.Generator().manual_seed(0)
    w = own["pooler.weight"]
    out["bert.pooler.weight"] = torch.empty_like(w).normal_(0.0, config.initializer_range, generator=g)
    out["bert.pooler.bias"] = torch.zeros_like(own["pooler.bias"])
    head = {"dense": "discriminator_predictions.dense", "prediction": "discriminator_predictions.dense_prediction"}
    if all(f"{h}.weight" in sd for h in head.values()):
        ref = DiscriminatorHead(config).state_dict()
        for o, h in head.items():
            for wb in ("weight", "bias"):
                t = sd[f"{h}.{wb}"]
                if t.shape != ref[f"{o}.{wb}"].shape:
                    raise BertraceError(
                        f"HF ELECTRA checkpoint: {h}.{wb} has shape {tuple(t.shape)}, expected "
                        f"{tuple(ref[f'{o}.{wb}'].shape)}"
                    )
                out[f"disc_head.{o}.{wb}"] = t.detach().clone()
    return config, out
