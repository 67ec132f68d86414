"""Sequences for fine-tuning: ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` (run_classifier.py
``convert_single_example``), cut to ``max_len`` by ``head`` (keep the start) or ``head_tail``
(keep the start and the end: Sun et al. 2019, "How to Fine-Tune BERT for Text
Classification?", section 5.3.1, best on IMDB with 128 head + 382 tail tokens of 512), and the
padding of a batch of them."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from pipeline.core.errors import BertraceError
from pipeline.core.formats import CLS_ID, PAD_ID, SEP_ID

IGNORE_INDEX = -100  # label of positions the loss skips (torch's cross_entropy default)
TRUNCATIONS = ("head", "head_tail")


def collate_task_batch(batch: Sequence[tuple[list[int], list[int], Any]]) -> dict[str, torch.Tensor]:
    """Pad a list of ``(input_ids, token_type_ids, label)`` to the batch's longest sequence.

    ``label``: an int (classification: int64 ``[B]``), a float (regression: float32 ``[B]``) or a
    per-position list (token classification: int64 ``[B, T]``, padding -100)."""
    T = max(len(ids) for ids, _, _ in batch)
    input_ids = torch.full((len(batch), T), PAD_ID, dtype=torch.long)
    token_type_ids = torch.zeros((len(batch), T), dtype=torch.long)
    attention_mask = torch.zeros((len(batch), T), dtype=torch.long)
    for i, (ids, types, _) in enumerate(batch):
        n = len(ids)
        input_ids[i, :n] = torch.tensor(ids)
        token_type_ids[i, :n] = torch.tensor(types)
        attention_mask[i, :n] = 1
    first = batch[0][2]
    if isinstance(first, (list, tuple)):
        labels = torch.full((len(batch), T), IGNORE_INDEX, dtype=torch.long)
        for i, (_, _, lab) in enumerate(batch):
            labels[i, : len(lab)] = torch.tensor(lab, dtype=torch.long)
    elif isinstance(first, float):
        labels = torch.tensor([label for _, _, label in batch], dtype=torch.float32)
    else:
        labels = torch.tensor([label for _, _, label in batch], dtype=torch.long)
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "labels": labels,
    }


# ---------------------------------------------------------------------------------------------
# Truncation and encoding
# ---------------------------------------------------------------------------------------------
def head_tail_split(n: int) -> int:
    """Head tokens kept when ``n`` tokens of a segment fit: 128 of 510 as Sun et al. (2019)
    (max_len 512), scaled down proportionally for shorter budgets."""
    return min(128, n * 128 // 510)


def cut(ids: list[int], n: int, truncation: str) -> list[int]:
    """Keep ``n`` of ``ids``: the first ``n`` (head) or a head and a tail (head_tail)."""
    if len(ids) <= n:
        return ids
    if truncation == "head" or n <= 0:
        return ids[:n]
    h = head_tail_split(n)
    return ids[:h] + ids[len(ids) - (n - h) :]


def pair_budget(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Google's ``_truncate_seq_pair``: shorten the longer segment one token at a time
    (ties: B, i.e. the one popped in run_classifier.py when A is not longer)."""
    while len_a + len_b > budget:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


def encode_examples(
    tokenizer, texts_a: list[str], texts_b: list[str] | None, max_len: int, truncation: str = "head"
) -> tuple[list[list[int]], list[list[int]], int]:
    """``(input_ids, token_type_ids, n_truncated)`` for single sentences or pairs."""
    if truncation not in TRUNCATIONS:
        raise BertraceError(f"params.yaml: finetune.truncation is {truncation!r}; use one of {list(TRUNCATIONS)}")
    min_len = 3 if texts_b is None else 5
    if max_len < min_len:
        raise BertraceError(f"params.yaml: finetune.max_len {max_len} is too small; it must be at least {min_len}")
    enc_a = [e.ids for e in tokenizer.encode_batch(texts_a, add_special_tokens=False)]
    enc_b = None if texts_b is None else [e.ids for e in tokenizer.encode_batch(texts_b, add_special_tokens=False)]
    all_ids, all_types, n_cut = [], [], 0
    for i, a in enumerate(enc_a):
        if enc_b is None:
            budget = max_len - 2
            n_cut += len(a) > budget
            a = cut(a, budget, truncation)
            ids = [CLS_ID, *a, SEP_ID]
            types = [0] * len(ids)
        else:
            b = enc_b[i]
            budget = max_len - 3
            la, lb = pair_budget(len(a), len(b), budget)
            n_cut += (la, lb) != (len(a), len(b))
            a, b = cut(a, la, truncation), cut(b, lb, truncation)
            ids = [CLS_ID, *a, SEP_ID, *b, SEP_ID]
            types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        all_ids.append(ids)
        all_types.append(types)
    return all_ids, all_types, n_cut


__all__ = [
    "IGNORE_INDEX",
    "TRUNCATIONS",
    "collate_task_batch",
    "cut",
    "encode_examples",
    "head_tail_split",
    "pair_budget",
]
