"""BERT's masked-LM corruption, shared by static (examples stage) and dynamic (load time) masking.

Follows ``create_masked_lm_predictions`` in Google's ``create_pretraining_data.py``:
``num_to_predict = min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob)))``
positions are drawn uniformly among the candidate tokens (whole words when
``whole_word_masking``), and each chosen position becomes ``[MASK]`` with probability
``mask_token_share`` (0.8), a random token with ``random_token_share`` (0.1), and stays
unchanged otherwise (l. 391-401).

Candidates: Google skips only ``[CLS]`` and ``[SEP]`` (``create_masked_lm_predictions``, l. 348
of google-research/bert@eedf571), so ``[UNK]`` is sometimes a prediction target; that is
``never_masked = (CLS, SEP)`` (the examples stage's default, ``mask_candidates: google``). With
``never_masked=None`` every special id is skipped (``skip_special``).

One deliberate difference: Google draws the random replacement from the whole vocabulary
(l. 401: special and ``[unused]`` tokens included); we draw it from the non-special ids only.

:func:`mask_rows` masks many rows at once from one Generator: the draws, in order, are one
float32 key per token, one float64 roll per chosen position, then the random replacements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

import numpy as np


@dataclass(frozen=True)
class MaskingSpec:
    """Everything the masking needs to know about the vocabulary and the recipe."""

    vocab_size: int
    mask_id: int
    special_ids: tuple[int, ...]  # never used as random replacements (and never masked when never_masked is None)
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word_masking: bool = False
    # is_continuation[id] is True for WordPiece continuation pieces ("##xx"); needed for
    # whole-word masking only.
    is_continuation: np.ndarray | None = None
    never_masked: tuple[int, ...] | None = None  # ids never chosen for prediction; None: special_ids
    mask_token_share: float = 0.8  # chosen positions that become [MASK] (Google l. 393)
    random_token_share: float = 0.1  # chosen positions that become a random non-special id (l. 397-401)

    CANDIDATES: ClassVar[tuple[str, ...]] = ("google", "skip_special")  # the examples.mask_candidates choices

    def __post_init__(self):
        if self.whole_word_masking and self.is_continuation is None:
            raise ValueError("whole_word_masking needs is_continuation (a bool array over the vocabulary)")
        shares = (self.mask_token_share, self.random_token_share)
        if min(shares) < 0 or sum(shares) > 1:
            raise ValueError(
                f"mask_token_share {self.mask_token_share} and random_token_share {self.random_token_share}: "
                "each must be >= 0 and together at most 1 (the rest stays unchanged)"
            )

    @staticmethod
    def never_masked_ids(mask_candidates: str, special_ids: Mapping[str, int]) -> tuple[int, ...]:
        """``google``: ``[CLS]`` and ``[SEP]`` only (Google's l. 348); ``skip_special``: every special id."""
        if mask_candidates == "google":
            return (special_ids["[CLS]"], special_ids["[SEP]"])
        if mask_candidates == "skip_special":
            return tuple(special_ids.values())
        raise ValueError(f"mask_candidates {mask_candidates!r}: must be one of {', '.join(MaskingSpec.CANDIDATES)}")

    @property
    def skipped_ids(self) -> tuple[int, ...]:
        """The ids that are never prediction candidates."""
        return self.special_ids if self.never_masked is None else self.never_masked

    @property
    def first_random_id(self) -> int:
        return max(self.special_ids) + 1


def mask_rows(ids: np.ndarray, offsets: np.ndarray, rng: np.random.Generator, spec: MaskingSpec):
    """Mask the rows ``ids[offsets[r]:offsets[r + 1]]`` at once.

    Per row ``num_to_predict`` positions (above) among its candidates: an i.i.d. float32 key per
    token, the smallest keys win (a uniform random subset); with whole-word masking a word
    takes its first piece's key and words are taken in key order by Google's rule (l. 365-380).
    Returns ``(masked_ids, positions_within_row, labels, positions_per_row)``; positions
    increase within a row, rows in order.
    """
    ids, offsets = np.asarray(ids), np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return ids.copy(), empty, ids[:0].copy(), empty
    lengths = np.diff(offsets)
    want = np.minimum(spec.max_predictions_per_seq, np.maximum(1, np.rint(lengths * spec.masked_lm_prob))).astype(
        np.int64
    )
    keys = rng.random(len(ids), dtype=np.float32)
    keys[np.isin(ids, spec.skipped_ids)] = 2.0  # keys are < 1: a skipped token is never among the smallest
    choose = _choose_words if spec.whole_word_masking else _choose_tokens
    chosen, per_row = choose(ids, offsets, keys, want, spec)
    positions = chosen - np.repeat(offsets[:-1], per_row)
    out, labels = _corrupt(ids, chosen, rng, spec)
    return out, positions, labels, per_row


def _choose_tokens(ids, offsets, keys, want, spec):
    """Flat indices of each row's ``want`` smallest candidate keys, and how many per row."""
    n, lengths = len(offsets) - 1, np.diff(offsets)
    # One row of keys per example, padded with 2.
    width = int(lengths.max())
    grid = np.full((n, width), 2.0, dtype=np.float32)
    flat = np.repeat(np.arange(n, dtype=np.int64) * width - offsets[:-1], lengths) + np.arange(len(ids))
    grid.ravel()[flat] = keys
    k = min(spec.max_predictions_per_seq, width)
    cols = np.argpartition(grid, k - 1, axis=1)[:, :k] if k < width else np.broadcast_to(np.arange(width), (n, width))
    sub = np.take_along_axis(grid, cols, axis=1)
    rank = np.argsort(np.argsort(sub, axis=1, kind="stable"), axis=1)  # rank of each of the k keys in its row
    take = (rank < want[:, None]) & (sub < 1.5)
    cols = np.sort(np.where(take, cols, width), axis=1)  # chosen columns first, increasing
    per_row = take.sum(axis=1)
    positions = cols[np.arange(k) < per_row[:, None]]  # row by row, increasing within a row
    return np.repeat(offsets[:-1], per_row) + positions, per_row


def _choose_words(ids, offsets, keys, want, spec):
    """Whole-word selection (Google l. 359-380), vectorised over rows.

    A word is a candidate that is not a ``##`` piece, or follows a skipped token or starts its
    row, plus the ``##`` candidates after it (so a word never spans a ``[SEP]``). Each row's
    words are visited in order of their first piece's key: stop at ``num_to_predict``, skip a
    word that would overflow it.
    """
    n = len(offsets) - 1
    cand = keys < 1.5
    row_of = np.repeat(np.arange(n), np.diff(offsets))
    after_gap = np.r_[True, ~cand[:-1]]
    after_gap[offsets[:-1][np.diff(offsets) > 0]] = True
    is_start = cand & (after_gap | ~spec.is_continuation[ids])
    starts = np.flatnonzero(is_start)
    if len(starts) == 0:
        return starts, np.zeros(n, dtype=np.int64)
    word_of = np.cumsum(is_start) - 1  # the word of each candidate
    size = np.bincount(word_of[cand], minlength=len(starts))
    word_row = row_of[starts]
    order = np.lexsort((starts, keys[starts], word_row))  # by row, then key
    first = np.searchsorted(word_row[order], np.arange(n + 1))
    rank = np.arange(len(order)) - first[word_row[order]]
    grid = np.full((n, int(np.diff(first).max(initial=0))), -1, dtype=np.int64)  # word at (row, rank)
    grid[word_row[order], rank] = order
    taken = np.zeros(len(starts), dtype=bool)
    count = np.zeros(n, dtype=np.int64)
    for j in range(grid.shape[1]):
        w = grid[:, j]
        fits = (w >= 0) & (count + size[w] <= want)  # once count == want nothing fits: Google's break
        taken[w[fits]] = True
        count += np.where(fits, size[w], 0)
        if (count >= want).all():
            break
    chosen = np.flatnonzero(cand & taken[word_of])
    return chosen, np.bincount(row_of[chosen], minlength=n)


def _corrupt(ids, chosen, rng, spec):
    """The 80/10/10 split (Google l. 391-401) with one roll per position: ``[MASK]`` below
    ``mask_token_share``, a random non-special id from ``1 - random_token_share`` on."""
    labels = ids[chosen]
    out = ids.copy()
    roll = rng.random(len(chosen))
    out[chosen[roll < spec.mask_token_share]] = spec.mask_id
    to_random = chosen[roll >= 1.0 - spec.random_token_share]
    out[to_random] = rng.integers(spec.first_random_id, spec.vocab_size, size=len(to_random))
    return out, labels
