"""Export a causal checkpoint as a Hugging Face GPT-2 directory (``bertrace export --hf``).

``pipeline/interop/export.py`` hands over any checkpoint whose weights are a :class:`~pipeline.models.gpt.GPT`
(``pretrain.objective: clm``) or a :class:`~pipeline.models.gpt.GPTForSequenceClassification` (a causal
checkpoint fine-tuned): the first becomes ``GPT2LMHeadModel`` (``AutoModelForCausalLM``), the
second ``GPT2ForSequenceClassification``. The layout, atomic write and verification are those of
the BERT export: weights through transformers' own ``save_pretrained``; the directory is loaded
back (``AutoTokenizer`` + the model class) and must encode probe texts to our ids and give logits
within 1e-4 of ours (relative to the logit scale) before it is moved into place.

The tokenizer is our WordPiece one, not GPT-2's byte-level BPE: ``tokenizer.json`` is loaded by
the generic ``PreTrainedTokenizerFast`` with the special tokens named in ``tokenizer_config.json``
(BOS = EOS = ``[SEP]``, the document separator; PAD = ``[PAD]``). For the language model its
template is ``[SEP] $A`` (what ``bertrace generate`` feeds the model: a prompt at the start of a
document, no trailing separator), so ``model.generate(**tokenizer(text, return_tensors="pt"))``
continues the text as ours does. The classifier keeps the fine-tuning template
(``[CLS] A [SEP]``, ``pipeline.finetune.encoding.encode_examples``). Neither returns ``token_type_ids``:
GPT-2 would add them as token embeddings.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.core.errors import BertraceError
from pipeline.core.formats import CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS, UNK_ID
from pipeline.core.io import sha256_file, write_json
from pipeline.data.tokenizer import encode_prompt, find_tokenizer
from pipeline.finetune.tasks.registry import get as get_task
from pipeline.interop.export_writer import SCRIPT_PROBES, hf_normalizer_config, write_export
from pipeline.interop.pyfunc import PROBE_TEXTS

SPECIAL_TOKENS_MAP = {
    "bos_token": "[SEP]",
    "eos_token": "[SEP]",
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def is_causal_checkpoint_file(path: str | Path) -> bool:
    """Whether ``path`` holds GPT weights (a causal LM or a classifier fine-tuned from one)."""
    from pipeline.models.checkpoint import is_causal_state_dict, read_checkpoint

    return is_causal_state_dict(read_checkpoint(path)["model"])


def load_causal_for_export(model_pt: str | Path, tokenizer_path: str | Path | None = None) -> dict[str, Any]:
    """``{kind: "causal_lm"|"classifier", model (eval), config, tokenizer, tokenizer_path,
    tokenizer_sha256, label_names, max_len, text_columns, checkpoint (without weights)}``."""
    from tokenizers import Tokenizer

    from pipeline.models.bert import BertConfig
    from pipeline.models.checkpoint import (
        check_finetuned,
        check_tokenizer_hash,
        is_finetuned,
        load_weights,
        read_checkpoint,
    )
    from pipeline.models.gpt import GPTForSequenceClassification, causal_lm_from_checkpoint

    path = Path(model_pt)
    ckpt = read_checkpoint(path)
    meta = {k: v for k, v in ckpt.items() if k != "model"}
    if not is_finetuned(ckpt):
        model, tokenizer, meta = causal_lm_from_checkpoint(ckpt, path, tokenizer_path)
        tok_path = find_tokenizer(path, tokenizer_path)
        return {
            "kind": "causal_lm",
            "model": model,
            "config": model.config,
            "tokenizer": tokenizer,
            "tokenizer_path": tok_path,
            "tokenizer_sha256": sha256_file(tok_path),
            "label_names": None,
            "max_len": model.config.max_position,
            "text_columns": None,
            "checkpoint": meta,
        }
    check_finetuned(ckpt, path)
    tok_path = Path(tokenizer_path) if tokenizer_path else path.parent / "tokenizer.json"
    sha = check_tokenizer_hash(tok_path, ckpt["tokenizer_sha256"], path)
    config = BertConfig.from_dict(ckpt["model_config"])
    model = GPTForSequenceClassification(config, int(ckpt["num_labels"]))
    load_weights(model, ckpt["model"], path)
    task = ckpt.get("task") or {}
    return {
        "kind": "classifier",
        "model": model.eval(),
        "config": config,
        "tokenizer": Tokenizer.from_file(str(tok_path)),
        "tokenizer_path": tok_path,
        "tokenizer_sha256": sha,
        "label_names": [str(n) for n in ckpt["label_names"]],
        "num_labels": int(ckpt["num_labels"]),
        "task_type": str(task["type"]),
        "max_len": int(task.get("max_len") or config.max_position),
        "truncation": str(task.get("truncation") or "head"),
        "text_columns": list(task.get("text_columns") or ["text"]),
        "checkpoint": meta,
    }


# --------------------------------------------------------------------------------------------
# Tokenizer files


def write_gpt_tokenizer_files(loaded: dict[str, Any], out_dir: Path) -> None:
    """tokenizer.json (the LM's with the ``[SEP] $A`` template), tokenizer_config.json,
    special_tokens_map.json for ``AutoTokenizer`` -> ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    src = loaded["tokenizer_path"]
    vocab = loaded["tokenizer"].get_vocab(with_added_tokens=True)
    for name, token_id in zip(SPECIAL_TOKENS, (PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID)):
        if vocab.get(name) != token_id:
            raise BertraceError(f"{src}: special token {name} is not id {token_id}; not a bertrace tokenizer")
    if loaded["kind"] == "causal_lm":
        tok = Tokenizer.from_file(str(src))
        tok.post_processor = TemplateProcessing(
            single="[SEP] $A", pair="[SEP] $A [SEP] $B:1", special_tokens=[("[SEP]", SEP_ID)]
        )
        (out_dir / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    else:
        shutil.copyfile(src, out_dir / "tokenizer.json")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **hf_normalizer_config(src),
        "model_max_length": int(loaded["max_len"]),
        "padding_side": "right",
        "truncation_side": "right",
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        **SPECIAL_TOKENS_MAP,
    }
    write_json(out_dir / "tokenizer_config.json", config)
    write_json(out_dir / "special_tokens_map.json", SPECIAL_TOKENS_MAP)


def _our_ids(loaded: dict[str, Any], texts: list[str], pairs: list[str] | None = None) -> list[list[int]]:
    """The ids our pipeline gives ``texts``: generate's prompt encoding, or fine-tuning's."""
    if loaded["kind"] == "causal_lm":
        return [encode_prompt(loaded["tokenizer"], t) for t in texts]
    from pipeline.finetune.encoding import encode_examples

    ids, _, _ = encode_examples(loaded["tokenizer"], texts, pairs, 10**6, "head")  # untruncated
    return ids


# --------------------------------------------------------------------------------------------
# Export


def export_gpt2(
    tf, model_pt: str | Path, out_dir: str | Path, tokenizer_path: str | Path | None = None, verify: bool = True
) -> dict[str, Any]:
    """Write ``out_dir`` (checked by the caller: absent, empty or a previous export) as a GPT-2
    directory; returns what it wrote, as ``pipeline.interop.export.export_hf``."""
    from pipeline.interop.hf_gpt import hf_gpt2_config, to_hf_gpt2_state_dict

    src, out_dir = Path(model_pt), Path(out_dir)
    loaded = load_causal_for_export(src, tokenizer_path)
    config, kind = loaded["config"], loaded["kind"]
    if kind == "classifier":
        n = loaded["num_labels"]
        names = loaded["label_names"] if len(loaded["label_names"]) == n else [f"LABEL_{i}" for i in range(n)]
        problem_type = get_task(loaded["task_type"]).hf_problem_type
        fields = hf_gpt2_config(config, num_labels=n)
        fields.update(
            id2label=dict(enumerate(names)),
            label2id={name: i for i, name in enumerate(names)},
            problem_type=problem_type,
            architectures=["GPT2ForSequenceClassification"],
        )
        hf_cls = tf.GPT2ForSequenceClassification
    else:
        fields = {**hf_gpt2_config(config), "architectures": ["GPT2LMHeadModel"]}
        hf_cls = tf.GPT2LMHeadModel
    hf_model = hf_cls(tf.GPT2Config(**fields))
    result = hf_model.load_state_dict(to_hf_gpt2_state_dict(loaded["model"]), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise BertraceError(
            f"{src}: weights do not map onto transformers.{hf_cls.__name__} (missing "
            f"{list(result.missing_keys)[:6]}, unexpected {list(result.unexpected_keys)[:6]}); "
            f"transformers {tf.__version__} may name GPT-2's parameters differently"
        )
    hf_model.eval()

    return write_export(
        tf,
        hf_model,
        hf_cls,
        loaded,
        src,
        out_dir,
        kind,
        verify,
        write_tokenizer=lambda d: write_gpt_tokenizer_files(loaded, d),
        verify_fn=_verify,
    )


def _padded(ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(i) for i in ids)
    input_ids = torch.tensor([i + [PAD_ID] * (T - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (T - len(i)) for i in ids])
    return input_ids, mask


@torch.no_grad()
def _verify(loaded: dict[str, Any], tf, hf_cls, directory: Path) -> dict[str, Any]:
    """Load ``directory`` back with transformers; compare tokenization and logits with ours."""
    hf_tok = tf.AutoTokenizer.from_pretrained(str(directory))
    pair = loaded["kind"] == "classifier" and len(loaded["text_columns"]) == 2
    a = list(PROBE_TEXTS)
    b = list(reversed(PROBE_TEXTS)) if pair else None
    enc = hf_tok(a, b) if pair else hf_tok(a)
    ours = _our_ids(loaded, a, b)
    scripts = hf_tok(SCRIPT_PROBES)["input_ids"]
    if (
        [list(x) for x in enc["input_ids"]] != ours
        or "token_type_ids" in enc
        or [list(x) for x in scripts] != _our_ids(loaded, SCRIPT_PROBES)
    ):
        raise BertraceError(
            f"export to {directory}: transformers' {type(hf_tok).__name__} encodes the probe texts "
            f"differently from {loaded['tokenizer_path']}; the export is not faithful "
            f"(transformers {tf.__version__})"
        )
    limit = min(loaded["max_len"], loaded["config"].max_position)
    input_ids, mask = _padded([i[:limit] for i in ours])
    hf_model = hf_cls.from_pretrained(str(directory)).eval()
    theirs = hf_model(input_ids=input_ids, attention_mask=mask).logits
    if loaded["kind"] == "classifier":
        mine = loaded["model"](input_ids, None, mask)
    else:
        valid = mask.bool()
        mine = loaded["model"](input_ids, mask).logits[valid]
        theirs = theirs[valid][:, : mine.size(-1)]  # a padded vocabulary's extra ids are never predicted
    diff = float((mine - theirs).abs().max())
    scale = max(1.0, float(np.abs(mine.numpy()).max()))
    if not diff <= 1e-4 * scale:
        raise BertraceError(
            f"export to {directory}: transformers' {hf_cls.__name__} logits differ from ours by "
            f"{diff:.3g} (tolerance {1e-4 * scale:.3g}); the export is not faithful "
            f"(transformers {tf.__version__})"
        )
    return {"probe_texts": len(a), "max_abs_logit_diff": diff, "tokenizer_ids_equal": True}


__all__ = ["is_causal_checkpoint_file", "load_causal_for_export", "write_gpt_tokenizer_files", "export_gpt2"]
