"""BERT's masked-LM corruption, shared by static (examples stage) and dynamic (load time) masking.

Follows ``create_masked_lm_predictions`` in Google's ``create_pretraining_data.py``:
``num_to_predict = min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob)))``
positions are drawn uniformly among the candidate tokens (whole words when
``whole_word_masking``), and each chosen position becomes ``[MASK]`` with probability 0.8,
stays unchanged with 0.1, and becomes a random token with 0.1.

Candidates: Google skips only ``[CLS]`` and ``[SEP]`` (``create_masked_lm_predictions``, l. 348
of google-research/bert@eedf571), so ``[UNK]`` is sometimes a prediction target; that is
``never_masked = (CLS, SEP)`` (the examples stage's default, ``mask_candidates: google``). With
``never_masked=None`` every special id is skipped (``skip_special``).

One deliberate difference: Google draws the random replacement from the whole vocabulary
(l. 401: special and ``[unused]`` tokens included); we draw it from the non-special ids only.
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

    CANDIDATES: ClassVar[tuple[str, ...]] = ("google", "skip_special")  # the examples.mask_candidates choices

    def __post_init__(self):
        if self.whole_word_masking and self.is_continuation is None:
            raise ValueError("whole_word_masking needs is_continuation (a bool array over the vocabulary)")

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


def mask_sequence(
    input_ids: np.ndarray, rng: np.random.Generator, spec: MaskingSpec
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Corrupt one sequence.

    Returns ``(masked_ids, positions, labels)``: a copy of ``input_ids`` with the chosen
    positions replaced, the chosen positions in increasing order, and the original ids there.
    """
    ids = np.asarray(input_ids)
    special = np.isin(ids, spec.skipped_ids)
    candidates = np.flatnonzero(~special)
    num_to_predict = min(spec.max_predictions_per_seq, max(1, int(round(len(ids) * spec.masked_lm_prob))))
    if len(candidates) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return ids.copy(), empty, empty.astype(ids.dtype)

    if spec.whole_word_masking:
        # A word is a candidate start followed by its "##" continuation pieces.
        starts = ~spec.is_continuation[ids[candidates]]
        starts[0] = True
        # A piece that follows a skipped token also starts a word (Google would glue a "##" piece
        # after [SEP] to the last word of A; a word never spans a [SEP] here).
        gaps = np.diff(candidates, prepend=candidates[0] - 1) != 1
        starts |= gaps
        word_of = np.cumsum(starts) - 1
        n_words = int(word_of[-1]) + 1
        bounds = np.flatnonzero(np.r_[starts, True])
        chosen: list[np.ndarray] = []
        count = 0
        for w in rng.permutation(n_words):
            if count >= num_to_predict:
                break
            size = bounds[w + 1] - bounds[w]
            if count + size > num_to_predict:
                continue
            chosen.append(candidates[bounds[w] : bounds[w + 1]])
            count += size
        positions = np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)
    else:
        positions = np.sort(rng.permutation(candidates)[:num_to_predict])

    labels = ids[positions].copy()
    out = ids.copy()
    roll = rng.random(len(positions))
    to_mask = roll < 0.8
    to_random = roll >= 0.9
    out[positions[to_mask]] = spec.mask_id
    n_random = int(to_random.sum())
    if n_random:
        out[positions[to_random]] = rng.integers(spec.first_random_id, spec.vocab_size, size=n_random)
    return out, positions.astype(np.int64), labels
