"""A tiny chain, tokenizer -> pre-trained -> fine-tuned checkpoint, for evaluate, export and app tests."""

from __future__ import annotations

import dataclasses
import random
import shutil
from pathlib import Path

import torch

from pipeline.core.io import sha256_file

WORDS = (
    "the a movie film story plot actor scene was is very quite rather this that good bad great dull "
    "funny boring gripping pointless best worst year café naïve résumé"
).split()


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choices(WORDS, k=rng.randint(3, 12))) + rng.choice([" .", " !", "", " , really ?"])
        for _ in range(n)
    ]


def train_tiny_tokenizer(path: Path, vocab_size: int = 300) -> Path:
    """WordPiece with the pipeline's normaliser / template; [PAD] [UNK] [CLS] [SEP] [MASK] = 0..4."""
    from tokenizers import trainers

    from pipeline.core.formats import SPECIAL_TOKENS
    from pipeline.data.tokenizer import build_tokenizer

    tok = build_tokenizer(lowercase=True)
    tok.train_from_iterator(
        sentences(300, 0),
        trainer=trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            continuing_subword_prefix="##",
            show_progress=False,
        ),
    )
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tok.to_str(), encoding="utf-8")
    return path


def tiny_config(vocab_size: int):
    from pipeline.models.bert import BertConfig

    return BertConfig(
        vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position=64
    )


def fake_chain() -> dict:
    """A fine-tuning provenance record embedding pre-training → examples → tokenizer → clean → download."""
    h = lambda c: c * 64  # noqa: E731 - a recognisable fake sha256
    git = lambda c: {"commit": c * 40, "dirty": False}  # noqa: E731
    download = {
        "stage": "download",
        "git": git("1"),
        "params_hash": h("a"),
        "inputs": {},
        "outputs": {"data/raw": h("b")},
        "upstream": {},
    }
    clean = {
        "stage": "clean",
        "git": git("2"),
        "params_hash": h("c"),
        "inputs": {"data/raw": h("b")},
        "outputs": {"data/clean/train.txt": h("d")},
        "upstream": {"download": download},
    }
    tokenizer = {
        "stage": "tokenizer",
        "git": git("3"),
        "params_hash": h("e"),
        "inputs": {"data/clean/train.txt": h("d")},
        "outputs": {"data/tokenizer/tokenizer.json": h("f")},
        "upstream": {"clean": clean},
    }
    examples = {
        "stage": "examples",
        "git": git("4"),
        "params_hash": h("0"),
        "inputs": {"data/clean/train.txt": h("d"), "data/tokenizer/tokenizer.json": h("f")},
        "outputs": {"data/examples/manifest.json": h("9")},
        "upstream": {"clean": clean, "tokenizer": tokenizer},
    }
    pretrain = {
        "stage": "pretrain",
        "git": git("5"),
        "params_hash": h("8"),
        "tokenizer_sha256": h("f"),
        "examples_manifest_sha256": h("9"),
        "upstream": {"examples": examples},
    }
    return {
        "stage": "finetune",
        "git": git("6"),
        "params_hash": h("7"),
        "inputs": {"data/pretrain/best.pt": h("6")},
        "task_files": {"sst2/dev.tsv": h("5")},
        "tokenizer_sha256": h("f"),
        "pretrain": pretrain,
    }


def make_finetuned(
    out_dir: Path,
    *,
    label_names=("negative", "positive"),
    text_columns=("sentence",),
    max_len: int = 32,
    seed: int = 0,
    scale: float = 30.0,
    provenance: dict | None = None,
    tokenizer: Path | None = None,
    pooling: str = "cls",
) -> Path:
    """``out_dir/model.pt`` + ``out_dir/tokenizer.json`` as the finetune stage writes them, with a random
    tiny BertForSequenceClassification (classifier weights scaled so predictions vary) that pools
    ``pooling`` (``classifier_pooling``: cls | mean)."""
    from pipeline.models.bert import BertForSequenceClassification
    from pipeline.models.checkpoint import save_finetuned

    out_dir.mkdir(parents=True, exist_ok=True)
    tok_path = out_dir / "tokenizer.json"
    if tokenizer is not None:
        shutil.copyfile(tokenizer, tok_path)
    else:
        train_tiny_tokenizer(tok_path)
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tok_path)).get_vocab_size()
    torch.manual_seed(seed)
    config = dataclasses.replace(tiny_config(vocab), classifier_pooling=pooling)
    model = BertForSequenceClassification(config, len(label_names)).eval()
    # A random encoder maps every text to nearly the same [CLS] vector: scale the classifier up and
    # centre its logits on sample texts so that the predicted class varies.
    from pipeline.finetune.encoding import collate_task_batch, encode_examples

    ids, types, _ = encode_examples(Tokenizer.from_file(str(tok_path)), sentences(64, 99), None, max_len)
    batch = collate_task_batch([(i, t, 0) for i, t in zip(ids, types)])
    with torch.no_grad():
        model.classifier.weight.mul_(scale)
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        model.classifier.bias.sub_(logits.mean(0))
    return save_finetuned(
        out_dir / "model.pt",
        state_dict=model.state_dict(),
        model_config=config.to_dict(),
        label_names=list(label_names),
        task={
            "text_columns": list(text_columns),
            "max_len": max_len,
            "truncation": "head",
            "source": {"type": "local"},
        },
        tokenizer_sha256=sha256_file(tok_path),
        mode="full",
        seed=seed,
        metrics={"validation_accuracy": 0.5},
        provenance=provenance if provenance is not None else fake_chain(),
    )
