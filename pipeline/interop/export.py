"""Export a bertrace checkpoint for use outside bertrace.

* :func:`export_hf` writes a Hugging Face directory that ``transformers`` loads with
  ``BertForSequenceClassification.from_pretrained(DIR)`` (a fine-tuned ``model.pt``) or
  ``BertForPreTraining.from_pretrained(DIR)`` (a pre-training ``best.pt`` / ``last.pt``), and
  ``AutoTokenizer.from_pretrained(DIR)`` (``BertTokenizerFast`` for a plain ``BertNormalizer``; the
  script-aware normaliser of ``tokenizer.strip_accents: auto`` is kept exactly by writing
  ``tokenizer_class: PreTrainedTokenizerFast``, since transformers' ``BertTokenizer`` rebuilds
  its normaliser from ``do_lower_case`` / ``strip_accents``). Weights are saved by transformers' own
  ``save_pretrained`` (``model.safetensors``), so the files match the installed version. Before
  the directory is moved into place it is loaded back and checked: the tokenizer must encode
  probe texts to our ids and the logits must equal ours. A causal checkpoint (``pretrain.objective:
  clm`` or a classifier fine-tuned from one) becomes a GPT-2 directory instead: :mod:`pipeline.interop.export_gpt`.
* the MLflow ``pyfunc`` model the evaluate stage logs is :mod:`pipeline.interop.pyfunc` (a stage's code,
  so kept apart: editing this file reruns no stage).

``transformers`` is imported only here, lazily: it is an export/test dependency
(``pip install 'bertrace[test]'``), not a pipeline one.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file, write_json
from pipeline.evaluate.inference import Classifier
from pipeline.finetune.tasks.registry import get as get_task
from pipeline.interop.export_gpt import export_gpt2, is_causal_checkpoint_file
from pipeline.interop.export_writer import EXPORT_INFO, SCRIPT_PROBES, hf_normalizer_config, write_export
from pipeline.interop.pyfunc import PROBE_TEXTS
from pipeline.models.checkpoint import check_tokenizer_hash, is_finetuned, load_weights, read_checkpoint

SPECIAL_TOKENS_MAP = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def _transformers():
    try:
        import transformers
    except ImportError:
        raise BertraceError(
            "exporting to Hugging Face format needs the transformers package, which is not installed; "
            "install it with `pip install 'bertrace[test]'` (or `pip install transformers`)"
        ) from None
    return transformers


@contextlib.contextmanager
def _quiet(tf):
    """transformers without its info messages and progress bars, restored afterwards."""
    log = tf.utils.logging
    verbosity, bars = log.get_verbosity(), log.is_progress_bar_enabled()
    log.set_verbosity_error()
    log.disable_progress_bar()
    try:
        yield
    finally:
        log.set_verbosity(verbosity)
        if bars:
            log.enable_progress_bar()


# --------------------------------------------------------------------------------------------
# Loading our side


def _find_tokenizer(path: Path, ckpt: dict[str, Any], tokenizer_path: str | Path | None) -> tuple[Path, str | None]:
    """The tokenizer of a checkpoint and the sha256 it must have.

    Fine-tuned: ``tokenizer.json`` next to ``model.pt``. Pre-training: next to the checkpoint,
    else the pipeline's ``data/tokenizer/tokenizer.json`` (``../tokenizer/`` from ``data/pretrain``).
    """
    expected = ckpt.get("tokenizer_sha256") or (ckpt.get("provenance") or {}).get("tokenizer_sha256")
    if tokenizer_path:
        return Path(tokenizer_path), expected
    candidates = [path.parent / "tokenizer.json"]
    if not is_finetuned(ckpt):
        candidates.append(path.parent.parent / "tokenizer" / "tokenizer.json")
    for c in candidates:
        if c.is_file():
            return c, expected
    raise BertraceError(
        f"{path}: no tokenizer.json found at {', '.join(map(str, candidates))}; pass the tokenizer "
        "the checkpoint was trained with (--tokenizer data/tokenizer/tokenizer.json)"
    )


def load_for_export(model_pt: str | Path, tokenizer_path: str | Path | None = None) -> dict[str, Any]:
    """``{kind: "classifier"|"pretraining", model (ours, eval), config, tokenizer, tokenizer_path,
    tokenizer_sha256, label_names, checkpoint (without weights)}``."""
    from tokenizers import Tokenizer

    from pipeline.models.bert import BertConfig, BertForPreTraining

    path = Path(model_pt)
    ckpt = read_checkpoint(path)
    tok_path, expected = _find_tokenizer(path, ckpt, tokenizer_path)
    if is_finetuned(ckpt):
        clf = Classifier.from_checkpoint(ckpt, path, tok_path)
        electra = clf.model.config.pooler_activation == "gelu"  # ELECTRA's classification head
        return {
            "kind": "classifier",
            "model": clf.model,
            "config": clf.model.config,
            "tokenizer": clf.tokenizer,
            "electra": electra,
            "task_type": clf.task_type,
            "tokenizer_path": tok_path,
            "tokenizer_sha256": sha256_file(tok_path),
            "label_names": clf.label_names,
            "max_len": clf.max_len,
            "truncation": clf.truncation,
            "text_columns": clf.text_columns,
            "checkpoint": clf.checkpoint,
        }
    sha = check_tokenizer_hash(tok_path, expected, path)
    config = BertConfig.from_dict(ckpt["model_config"])
    train_config = ckpt.get("train_config") or {}
    electra = train_config.get("objective") == "electra"
    if electra:  # the discriminator is exported (ElectraForPreTraining); see pipeline/models/electra.py
        from pipeline.models.electra import ElectraForPreTraining, generator_config

        e = train_config.get("electra") or {}
        model = ElectraForPreTraining(
            config, generator_config(config, e.get("generator_size", 0.25), e.get("generator_layers", 1.0))
        )
    else:
        model = BertForPreTraining(config)
    load_weights(model, ckpt["model"], path)
    model.eval()
    return {
        "kind": "pretraining",
        "model": model,
        "config": config,
        "tokenizer": Tokenizer.from_file(str(tok_path)),
        "electra": electra,
        "tokenizer_path": tok_path,
        "tokenizer_sha256": sha,
        "label_names": None,
        "max_len": config.max_position,
        "truncation": "head",
        "text_columns": None,
        "checkpoint": {k: v for k, v in ckpt.items() if k != "model"},
    }


# --------------------------------------------------------------------------------------------
# Tokenizer files


def bert_class_is_exact(tokenizer_json: str | Path) -> bool:
    """Whether transformers' ``BertTokenizer`` (which builds a ``BertNormalizer`` from its config)
    normalises as ``tokenizer_json`` does: only for a plain ``BertNormalizer``."""
    data = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    return (data.get("normalizer") or {}).get("type") == "BertNormalizer"


def write_tokenizer_files(tokenizer, tokenizer_json: Path, out_dir: Path, model_max_length: int) -> None:
    """vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json (BERT layout)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise BertraceError(
            f"{tokenizer_json}: vocabulary ids are not 0..{len(by_id) - 1}; it cannot be written as vocab.txt"
        )
    for token in SPECIAL_TOKENS_MAP.values():
        if token not in vocab:
            raise BertraceError(f"{tokenizer_json}: special token {token} missing from the vocabulary")
    (out_dir / "vocab.txt").write_text("".join(t + "\n" for t, _ in by_id), encoding="utf-8")
    shutil.copyfile(tokenizer_json, out_dir / "tokenizer.json")
    config = {
        # the generic class loads tokenizer.json as it is; BertTokenizer would rebuild the normaliser
        "tokenizer_class": "BertTokenizer" if bert_class_is_exact(tokenizer_json) else "PreTrainedTokenizerFast",
        **hf_normalizer_config(tokenizer_json),
        "model_max_length": int(model_max_length),
        "padding_side": "right",
        "truncation_side": "right",
        "clean_up_tokenization_spaces": False,
        **SPECIAL_TOKENS_MAP,
    }
    if config["tokenizer_class"] != "BertTokenizer":  # the generic class returns no segment ids unless told
        config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    write_json(out_dir / "tokenizer_config.json", config)
    write_json(out_dir / "special_tokens_map.json", SPECIAL_TOKENS_MAP)


# --------------------------------------------------------------------------------------------
# Hugging Face export


def _probe_batch(loaded: dict[str, Any]) -> tuple[list[list[int]], list[list[int]], list[str], list[str] | None]:
    from pipeline.finetune.encoding import encode_examples

    a = PROBE_TEXTS
    pair = loaded["kind"] == "pretraining" or len(loaded["text_columns"] or []) == 2
    b = list(reversed(PROBE_TEXTS)) if pair else None
    ids, types, _ = encode_examples(
        loaded["tokenizer"], a, b, min(loaded["max_len"], loaded["config"].max_position), "head"
    )
    return ids, types, a, b


def _pad(ids: list[list[int]], types: list[list[int]]) -> dict[str, torch.Tensor]:
    from pipeline.finetune.encoding import collate_task_batch

    batch = collate_task_batch([(i, t, 0) for i, t in zip(ids, types)])
    batch.pop("labels")
    return batch


@torch.no_grad()
def _compare(loaded: dict[str, Any], hf_model, ids, types) -> float:
    """Max |logit difference| between our model and the HF one on the probe batch."""
    batch = _pad(ids, types)
    ours = loaded["model"]
    hf_model.eval()
    hf_out = hf_model(
        input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"]
    )
    if loaded["kind"] == "classifier":
        a = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        if a.dim() == 3:  # token classification: the real (unpadded) positions
            mask = batch["attention_mask"].bool()
            return float((a[mask] - hf_out.logits[mask]).abs().max())
        return float((a - hf_out.logits).abs().max())
    valid = batch["attention_mask"].bool()
    if loaded.get("electra"):  # the discriminator's replaced-token logits
        disc = ours.discriminator_logits(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        return float((disc[valid] - hf_out.logits[valid]).abs().max())
    out = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    mlm = float((out.mlm_logits[valid] - hf_out.prediction_logits[valid]).abs().max())
    nsp = float((out.nsp_logits - hf_out.seq_relationship_logits).abs().max())
    return max(mlm, nsp)


def export_hf(
    model_pt: str | Path, out_dir: str | Path, tokenizer_path: str | Path | None = None, verify: bool = True
) -> dict[str, Any]:
    """Write ``out_dir`` as a Hugging Face model + tokenizer directory; returns what it wrote.

    A fine-tuned checkpoint becomes ``BertForSequenceClassification`` (config with
    ``id2label`` / ``label2id``; a regression model ``num_labels`` 1 and ``problem_type:
    regression``) or ``BertForTokenClassification`` (task type token_classification; no pooler,
    as transformers' class), a pre-training one ``BertForPreTraining``. From ELECTRA
    (``pretrain.objective: electra``) the pre-training checkpoint's discriminator becomes
    ``ElectraForPreTraining`` and a classifier fine-tuned from it (ELECTRA's classification head,
    ``pooler_activation: gelu``) ``ElectraForSequenceClassification``. Also written:
    ``bertrace_export.json`` (source checkpoint and tokenizer sha256, task, provenance). With
    ``verify`` the directory is loaded back with transformers first: a tokenizer that encodes the
    probe texts differently, or logits further than 1e-4 (relative to the logit scale) from ours,
    is an error and nothing is written. ``out_dir`` is replaced only if it is empty or a previous
    bertrace export.
    """
    tf = _transformers()
    with _quiet(tf):
        return _export_hf(tf, model_pt, out_dir, tokenizer_path, verify)


def _export_hf(tf, model_pt, out_dir, tokenizer_path, verify) -> dict[str, Any]:
    from pipeline.interop.hf import electra_hf_config, hf_config, to_hf_electra_state_dict, to_hf_state_dict

    src = Path(model_pt)
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or (any(out_dir.iterdir()) and not (out_dir / EXPORT_INFO).exists())):
        raise BertraceError(f"{out_dir}: exists and is not a bertrace export; choose a new directory or remove it")

    if is_causal_checkpoint_file(src):  # pretrain.objective: clm, or a classifier fine-tuned from it: GPT-2 layout
        return export_gpt2(tf, src, out_dir, tokenizer_path, verify)
    loaded = load_for_export(src, tokenizer_path)
    config, kind = loaded["config"], loaded["kind"]

    electra = bool(loaded.get("electra"))
    if config.pre_ln:
        raise BertraceError(
            f"{src}: a pre-LN encoder (pretrain.model.pre_ln: true), which transformers' BERT and "
            "ELECTRA classes (post-LN) cannot express; export a post-LN checkpoint, or use this one "
            "with bertrace (finetune, evaluate, predict)"
        )
    if kind == "classifier" and config.classifier_pooling != "cls":
        raise BertraceError(
            f"{src}: its classifier pools the mean of the tokens (finetune.pooling: "
            f"{config.classifier_pooling}), which transformers' sequence classifiers ([CLS] only) cannot "
            "express; fine-tune with finetune.pooling: cls to export it, or use this one with bertrace "
            "(evaluate, predict, serve)"
        )
    if not electra and config.embedding_dim != config.hidden_size:
        raise BertraceError(
            f"{src}: embedding_size {config.embedding_dim} differs from hidden_size "
            f"{config.hidden_size}, which transformers' BERT cannot express; only ELECTRA "
            "checkpoints (pretrain.objective: electra) export with it"
        )
    family = "Electra" if electra else "Bert"
    fields = (electra_hf_config if electra else hf_config)(
        config, len(loaded["label_names"]) if kind == "classifier" else None
    )
    task_type = loaded.get("task_type") or "classification"
    task = get_task(task_type)
    if kind == "classifier" and not task.electra_export and electra:
        raise BertraceError(
            f"{src}: exporting an ELECTRA {task_type} model is not supported yet; only BERT's "
            "token classification and regression heads export"
        )
    if kind == "classifier":  # the task type's head: id2label / label2id, problem_type, architectures
        head_fields, class_name = task.hf_fields(loaded["label_names"], family)
        fields.update(head_fields)
        hf_cls = getattr(tf, class_name)
    else:
        fields.update(architectures=[f"{family}ForPreTraining"])
        hf_cls = getattr(tf, f"{family}ForPreTraining")
    hf_model = hf_cls(getattr(tf, f"{family}Config")(**fields))
    sd = (
        to_hf_electra_state_dict(loaded["model"], "classifier" if kind == "classifier" else "discriminator")
        if electra
        else to_hf_state_dict(loaded["model"])
    )
    result = hf_model.load_state_dict(sd, strict=False)
    allowed_missing = {
        "bert.embeddings.position_ids",
        "bert.embeddings.token_type_ids",
        "cls.predictions.decoder.weight",
        "cls.predictions.decoder.bias",
        "electra.embeddings.position_ids",
        "electra.embeddings.token_type_ids",
    }
    bad_missing = [k for k in result.missing_keys if k not in allowed_missing]
    if bad_missing or result.unexpected_keys:
        raise BertraceError(
            f"{src}: weights do not map onto transformers.{hf_cls.__name__} (missing {bad_missing[:6]}, "
            f"unexpected {list(result.unexpected_keys)[:6]}); transformers {tf.__version__} may "
            "name BERT's parameters differently"
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
        write_tokenizer=lambda d: write_tokenizer_files(
            loaded["tokenizer"],
            loaded["tokenizer_path"],
            d,
            loaded["max_len"] if kind == "classifier" else config.max_position,
        ),
        verify_fn=_verify,
    )


def _verify(loaded: dict[str, Any], tf, hf_cls, directory: Path) -> dict[str, Any]:
    """Load ``directory`` back with transformers; compare tokenization and logits with ours."""
    ids, types, a, b = _probe_batch(loaded)
    hf_tok = tf.AutoTokenizer.from_pretrained(str(directory))
    enc = hf_tok(a, b) if b is not None else hf_tok(a)
    ours = loaded["tokenizer"].encode_batch(list(zip(a, b)) if b is not None else a)  # untruncated, with [CLS]/[SEP]
    scripts = hf_tok(SCRIPT_PROBES)["input_ids"]  # the normaliser on marks, tones, CJK, Hangul
    if (
        [list(x) for x in enc["input_ids"]] != [e.ids for e in ours]
        or [list(x) for x in enc["token_type_ids"]] != [e.type_ids for e in ours]
        or [list(x) for x in scripts] != [e.ids for e in loaded["tokenizer"].encode_batch(SCRIPT_PROBES)]
    ):
        raise BertraceError(
            f"export to {directory}: transformers' {type(hf_tok).__name__} encodes the probe texts "
            f"differently from {loaded['tokenizer_path']}; the export is not faithful "
            f"(transformers {tf.__version__})"
        )
    hf_model = hf_cls.from_pretrained(str(directory))
    diff = _compare(loaded, hf_model, ids, types)
    scale = max(1.0, float(np.abs(_pad_logits(loaded, ids, types)).max()))
    if not diff <= 1e-4 * scale:
        raise BertraceError(
            f"export to {directory}: transformers' {hf_cls.__name__} logits differ from ours by {diff:.3g} "
            f"(tolerance {1e-4 * scale:.3g}); the export is not faithful (transformers {tf.__version__})"
        )
    return {"probe_texts": len(a), "max_abs_logit_diff": diff, "tokenizer_ids_equal": True}


@torch.no_grad()
def _pad_logits(loaded: dict[str, Any], ids, types) -> np.ndarray:
    batch = _pad(ids, types)
    if loaded.get("electra") and loaded["kind"] == "pretraining":
        return (
            loaded["model"]
            .discriminator_logits(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
            .numpy()
        )
    out = loaded["model"](batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    return (out if loaded["kind"] == "classifier" else out.nsp_logits).numpy()
