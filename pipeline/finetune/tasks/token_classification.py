"""``token_classification`` (NER): ``text_columns`` names one column of word lists and
``label_column`` one of tag lists (ints indexing ``label_names`` or tag strings), e.g. the hub's
CoNLL-2003 ``tokens`` / ``ner_tags``, or a CoNLL file. Tags must be BIO (IOB2). BertForTokenClassification,
cross-entropy at each word's first sub-token (the other pieces get -100:
:mod:`pipeline.finetune.token_data`), entity-level F1 (seqeval) to pick the best check and seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.core.errors import BertraceError
from pipeline.finetune.encoding import IGNORE_INDEX
from pipeline.finetune.task_files import ROWS_CONVENTION, Rows, cell_text, missing_error, nfc
from pipeline.finetune.task_metrics import entity_metrics
from pipeline.finetune.tasks.base import TaskType
from pipeline.finetune.token_data import bio_violations, check_bio, encode_words
from pipeline.models.bert import BertForTokenClassification


def word_list(v: Any, rows: Rows, column: str, i: int) -> list[str]:
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        raise BertraceError(
            f"{rows.where}: data row {i + 1} ({ROWS_CONVENTION}) of column {column!r} is {type(v).__name__}, "
            "not a list of words; token_classification reads a column of word lists (or a CoNLL file)"
        )
    return [cell_text(w) for w in v]


def tag_labels(
    values: list,
    words: list,
    label_names: list[str],
    rows: Rows,
    label_column: str,
    text_column: str,
    role: str,
    skip: np.ndarray,
) -> list[list[int]] | None:
    """Per example the word tag ids (ints index ``label_names``, strings are looked up in it, in
    NFC); the tag list must be as long as the word list. Rows in ``skip`` (no words) get no tags.
    Every kept row untagged = an unlabelled (test) split; some = an error."""
    index = {name: i for i, name in enumerate(label_names)}
    out: list[list[int]] = []
    bad: set[str] = set()
    n_bad = 0
    for i, (tags, ws) in enumerate(zip(values, words)):
        if skip[i]:
            out.append([])
            continue
        tags = [] if tags is None else (tags.tolist() if isinstance(tags, np.ndarray) else list(tags))
        n_words = len(word_list(ws, rows, text_column, i))
        if tags and len(tags) != n_words:
            raise BertraceError(
                f"{rows.where}: data row {i + 1} ({ROWS_CONVENTION}) has {n_words} words in {text_column!r} but "
                f"{len(tags)} tags in {label_column!r}; each word needs exactly one tag"
            )
        ids = []
        for t in tags:
            if isinstance(t, str):
                k = index.get(nfc(t.strip()), -1)
            elif isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_)):
                k = int(t) if 0 <= int(t) < len(label_names) else -1
            else:
                k = -1
            if k < 0:
                bad.add(repr(t))
                n_bad += 1
            ids.append(k)
        out.append(ids)
    if bad:
        raise BertraceError(
            f"{rows.where}: column {label_column!r} has tags outside finetune.task.label_names {label_names}: "
            f"{', '.join(sorted(bad)[:8])} ({n_bad} words); list every tag in finetune.task.label_names"
        )
    missing = np.flatnonzero([not ids and not skipped for ids, skipped in zip(out, skip)])
    kept = int((~skip).sum())
    if len(missing) == kept:
        if role != "test":
            raise BertraceError(
                f"{rows.where}: the {role} split has no tags; pick a labelled split in finetune.task.splits.{role}"
            )
        return None
    if len(missing):
        raise missing_error(rows, label_column, "tags", missing, kept)
    return out


class TokenClassification(TaskType):
    """One BIO tag per word: see the module docstring."""

    name: ClassVar[str] = "token_classification"
    selection: ClassVar[str] = "f1"
    short: ClassVar[str] = "f1"
    metric_title: ClassVar[str] = "entity F1"
    title: ClassVar[str] = "token classification (NER)"
    evaluation: ClassVar[str] = "entities"
    dvc_keys: ClassVar[tuple[str, ...]] = ("f1",)
    token_level: ClassVar[bool] = True
    pools: ClassVar[bool] = False
    fill_what: ClassVar[str] = "words"

    def check_params(self, params) -> None:
        if len(params.text_columns) != 1:
            raise BertraceError(
                f"params.yaml: finetune.task.text_columns is {params.text_columns!r}; token_classification "
                "reads one column of word lists (e.g. [tokens])"
            )

    def missing_label_names(self, rows_by_split: dict[str, Rows], label_column: str) -> BertraceError:
        found = sorted(
            {
                str(t)
                for r in rows_by_split.values()
                if label_column in r.columns
                for seq in r.columns[label_column]
                if isinstance(seq, (list, tuple, np.ndarray))
                for t in seq
            }
        )
        return BertraceError(
            f"params.yaml: finetune.task.label_names is empty; list the BIO tags in label order, "
            f"e.g. [O, B-X, I-X, ...] (the data has: {found[:40]})"
        )

    def check_label_names(self, label_names: list[str], where: str) -> None:
        check_bio(label_names, where)

    def empty_rows(self, rows: Rows, text_columns: list[str]) -> np.ndarray:
        """Per row: True when the word list is null or has no words."""
        empty = np.zeros(len(rows.columns[text_columns[0]]), dtype=bool)
        for c in text_columns:
            for i, v in enumerate(rows.columns[c]):
                empty[i] |= (
                    v is None
                    or (isinstance(v, float) and np.isnan(v))
                    or (isinstance(v, (list, tuple, np.ndarray)) and len(v) == 0)
                )
        return empty

    def empty_text(self, text_columns: list[str]) -> str:
        return f"no words in {text_columns[0]!r}"

    def read_labels(self, rows, text_columns, label_column, label_names, role, skip):
        column = text_columns[0]
        values, words = rows.columns[label_column], rows.columns[column]
        return tag_labels(values, words, label_names, rows, label_column, column, role, skip)

    def encode(self, tokenizer, rows, text_columns, labels, idx, ctx) -> dict[str, Any]:
        """Words to WordPieces, each word's tag at its first piece (:func:`~pipeline.finetune.token_data.encode_words`)."""
        column, label_names = text_columns[0], ctx["label_names"]
        words = [word_list(rows.columns[column][i], rows, column, int(i)) for i in idx]
        word_labels = None if labels is None else [labels[i] for i in idx]
        enc = encode_words(tokenizer, words, word_labels, ctx["max_len"])
        violations = 0 if word_labels is None else bio_violations([[label_names[t] for t in s] for s in word_labels])
        multi = int((ctx["tables"].get(Path(rows.where).as_posix()) or {}).get("multi_tags") or 0)
        return {
            "input_ids": enc["input_ids"],
            "token_type_ids": enc["token_type_ids"],
            "labels": enc["labels"],
            "truncated": enc["truncated"],
            "word_labels": word_labels,
            "first": enc["first"],
            "words": words,
            "bio_violations": violations,
            "multi_tags": multi,
        }

    def item_label(self, split, i: int) -> Any:
        return [IGNORE_INDEX] * len(split.input_ids[i]) if split.labels is None else split.labels[i]

    def split_details(self, splits: dict[str, Any]) -> dict[str, Any]:
        """I-X after O or another type; CoNLL "a,b" tag fields."""
        return {
            "bio_violations": {role: s.bio_violations for role, s in splits.items()},
            "multi_tags": {role: s.multi_tags for role, s in splits.items()},
        }

    def head_class(self) -> type[torch.nn.Module]:
        return BertForTokenClassification

    def check_decoder(self, source: str) -> None:
        raise BertraceError(
            f"{source}: a causal (GPT) checkpoint fine-tunes sequence tasks only (classification, "
            "regression); for token classification pre-train an encoder (pretrain.objective mlm_nsp, "
            "mlm or electra)"
        )

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy over the positions whose label is not -100 (each word's first sub-token)."""
        return F.cross_entropy(
            logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100, reduction=reduction
        )

    def check_evaluable(self, label_names) -> None:
        if not label_names:
            raise ValueError("evaluate: token classification needs label_names")

    def counted(self, labels: torch.Tensor, n: int) -> Any:
        return (labels != -100).sum()

    def outputs(self, logits: torch.Tensor) -> list[Any]:
        return logits.argmax(-1).cpu().tolist()

    def metrics(self, outputs, split, label_names, loss: float, n: int) -> dict:
        """Entity-level ``f1`` / ``precision`` / ``recall`` (seqeval) and word ``accuracy``; a word
        without a position (cut by max_len) is predicted 'O'."""
        gold = [[label_names[t] for t in tags] for tags in split.word_labels]
        pred = [[label_names[row[p]] if p >= 0 else "O" for p in first] for row, first in zip(outputs, split.first)]
        m = entity_metrics(gold, pred)
        return {
            "f1": m["f1"],
            "precision": m["precision"],
            "recall": m["recall"],
            "accuracy": m["accuracy"],
            "loss": loss,
            "n": n,
        }

    def predict(self, clf, texts, batch_size: int) -> list[dict[str, Any]]:
        """``[{"entities": [{type, text, start, end}], "words": [...], "tags": [...]}]``."""
        return clf.tag(texts, batch_size=batch_size)

    def cli_prediction(self, pred: dict[str, Any]) -> dict[str, Any]:
        """The spans only: {type, text, start, end} (characters)."""
        return {"entities": pred["entities"]}

    def pyfunc_columns(self, clf, inputs, batch_size: int) -> dict[str, Any]:
        """One column: the entities as JSON ({type, text, start, end})."""
        import json

        tagged = clf.tag(inputs, batch_size=batch_size)
        return {"entities": [json.dumps(t["entities"], ensure_ascii=False) for t in tagged]}

    def describe(self, text_columns: list[str], label_names: list[str]) -> str:
        return f"{text_columns[0]} → BIO tags of {', '.join(sorted({n[2:] for n in label_names if n != 'O'}))}"

    def result_line(self, role: str, r: dict[str, Any]) -> str:
        return f"{role} entity F1 {r['f1']:.4f} (P {r['precision']:.4f}, R {r['recall']:.4f}, n={r['n']})"

    def hf_fields(self, label_names: list[str], family: str) -> tuple[dict[str, Any], str]:
        """``BertForTokenClassification``: no pooler, as transformers' class."""
        return (
            {
                "id2label": {i: n for i, n in enumerate(label_names)},
                "label2id": {n: i for i, n in enumerate(label_names)},
                "architectures": [f"{family}ForTokenClassification"],
            },
            f"{family}ForTokenClassification",
        )


__all__ = ["TokenClassification", "tag_labels", "word_list"]
