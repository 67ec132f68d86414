"""BERT's masked-LM corruption (pipeline/data/masking.py): one vectorised ``mask_rows`` for
static masking (whole shards), dynamic masking (one row at a time) and whole-word masking,
checked against Google's ``create_masked_lm_predictions`` (l. 342-415 of eedf571)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.formats import SPECIAL_IDS
from pipeline.data.masking import MaskingSpec, mask_rows

CLS, SEP, MASK, UNK = SPECIAL_IDS["[CLS]"], SPECIAL_IDS["[SEP]"], SPECIAL_IDS["[MASK]"], SPECIAL_IDS["[UNK]"]
VOCAB = 60
CONT = np.arange(VOCAB) % 3 != 0  # ids not divisible by 3 are "##" pieces
CONT[: max(SPECIAL_IDS.values()) + 1] = False


def _spec(whole_word=False, **kw) -> MaskingSpec:
    return MaskingSpec(
        VOCAB,
        MASK,
        tuple(SPECIAL_IDS.values()),
        whole_word_masking=whole_word,
        is_continuation=CONT if whole_word else None,
        **kw,
    )


def _rows(n: int, seed: int = 0, lo: int = 8, hi: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """``[CLS] A [SEP] B [SEP]`` rows of random ids (B may start with a "##" piece)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        la, lb = rng.integers(lo // 2, hi // 2, size=2)
        rows.append(np.r_[CLS, rng.integers(5, VOCAB, la), SEP, rng.integers(5, VOCAB, lb), SEP])
    offsets = np.r_[0, np.cumsum([len(r) for r in rows])].astype(np.int64)
    return np.concatenate(rows).astype(np.uint16), offsets


def _want(offsets: np.ndarray, spec: MaskingSpec) -> np.ndarray:
    return np.array([min(spec.max_predictions_per_seq, max(1, round(n * spec.masked_lm_prob))) for n in np.diff(offsets)])


def _per_row(ids, offsets, out, positions, labels, per_row):
    """``(original row, masked row, positions, labels)`` per row."""
    ends = np.cumsum(per_row)
    for r in range(len(offsets) - 1):
        a, b = offsets[r], offsets[r + 1]
        yield ids[a:b], out[a:b], positions[ends[r] - per_row[r] : ends[r]], labels[ends[r] - per_row[r] : ends[r]]


@pytest.mark.parametrize("whole_word", [False, True])
def test_num_to_predict_per_row_and_never_a_skipped_id(whole_word):
    ids, offsets = _rows(300)
    ids[np.random.default_rng(1).random(len(ids)) < 0.05] = UNK  # a google candidate, skipped by skip_special
    for mode in MaskingSpec.CANDIDATES:
        spec = _spec(whole_word, never_masked=MaskingSpec.never_masked_ids(mode, SPECIAL_IDS))
        out, positions, labels, per_row = mask_rows(ids, offsets, np.random.default_rng(2), spec)
        want = _want(offsets, spec)
        assert (per_row <= want).all() and per_row.sum() == len(positions) == len(labels)
        if whole_word:  # a word that would overflow is skipped: a row may end below num_to_predict
            assert (per_row >= want - 2).all() and (per_row == want).mean() > 0.5
        else:
            assert (per_row == want).all()
        assert not np.isin(labels, spec.skipped_ids).any()
        for row, masked, pos, lbl in _per_row(ids, offsets, out, positions, labels, per_row):
            assert (np.diff(pos) > 0).all() and np.array_equal(row[pos], lbl)
            unchanged = np.ones(len(row), dtype=bool)
            unchanged[pos] = False
            assert np.array_equal(masked[unchanged], row[unchanged])  # only chosen positions change


def test_rows_without_candidates_or_rows_at_all():
    spec = _spec(never_masked=None)
    out, positions, labels, per_row = mask_rows(np.array([CLS, SEP, SEP]), np.array([0, 3]), np.random.default_rng(0), spec)
    assert out.tolist() == [CLS, SEP, SEP] and len(positions) == len(labels) == 0 and per_row.tolist() == [0]
    for whole_word in (False, True):
        empty = mask_rows(np.zeros(0, np.uint16), np.array([0]), np.random.default_rng(0), _spec(whole_word))
        assert [len(x) for x in empty] == [0, 0, 0, 0]


def _google_words(row: np.ndarray, keys: np.ndarray, spec: MaskingSpec) -> list[int]:
    """Google's whole-word loop (l. 346-387) for one row, its shuffle replaced by an order of
    the words' first-piece keys; a '##' piece after a skipped token starts a word."""
    words: list[list[int]] = []
    for i, t in enumerate(row):
        if t in spec.skipped_ids:
            continue
        if words and spec.is_continuation[t] and words[-1][-1] == i - 1:
            words[-1].append(i)
        else:
            words.append([i])
    num_to_predict = min(spec.max_predictions_per_seq, max(1, round(len(row) * spec.masked_lm_prob)))
    chosen: list[int] = []
    for word in sorted(words, key=lambda w: (keys[w[0]], w[0])):
        if len(chosen) >= num_to_predict:
            break
        if len(chosen) + len(word) > num_to_predict:
            continue
        chosen += word
    return sorted(chosen)


@pytest.mark.parametrize("bare", [False, True])
@pytest.mark.parametrize("prob, max_pred", [(0.15, 20), (0.4, 30), (0.05, 3)])
def test_whole_word_masking_is_googles_rule_on_whole_words(prob, max_pred, bare):
    """``bare``: rows without [CLS]/[SEP], so a row may start with a '##' piece (a word of its own)."""
    ids, offsets = _rows(200, seed=3)
    if bare:
        keep = ~np.isin(ids, (CLS, SEP))
        offsets = np.r_[0, np.cumsum(np.add.reduceat(keep, offsets[:-1]))]
        ids = ids[keep]
    spec = _spec(True, masked_lm_prob=prob, max_predictions_per_seq=max_pred, never_masked=(CLS, SEP))
    out, positions, labels, per_row = mask_rows(ids, offsets, np.random.default_rng(4), spec)
    keys = np.random.default_rng(4).random(len(ids), dtype=np.float32)  # mask_rows' first draw
    skipped_words = 0
    for r, (row, _, pos, _) in enumerate(_per_row(ids, offsets, out, positions, labels, per_row)):
        assert pos.tolist() == _google_words(row, keys[offsets[r] : offsets[r + 1]], spec)
        chosen = np.zeros(len(row) + 1, dtype=bool)
        chosen[pos] = True
        # whole words: a chosen '##' piece's predecessor is chosen unless it is [SEP]/[CLS] (a word
        # never spans them); the '##' piece after a chosen piece is chosen too
        cont = CONT[row]
        prev_special = np.isin(np.r_[CLS, row[:-1]], (CLS, SEP))
        assert (chosen[:-1] <= ~cont | prev_special | np.r_[False, chosen[:-2]]).all()
        assert (chosen[:-2] & cont[1:] <= chosen[1:-1]).all()
        skipped_words += len(pos) < _want(offsets[r : r + 2] - offsets[r], spec)[0]
    assert CONT[labels].mean() > 0.2 and skipped_words > 0  # multi-piece words, and the skip rule, happen


@pytest.mark.parametrize("whole_word", [False, True])
@pytest.mark.parametrize("mask_share, random_share", [(0.8, 0.1), (0.5, 0.25), (1.0, 0.0), (0.0, 1.0)])
def test_mask_random_keep_shares(whole_word, mask_share, random_share):
    ids, offsets = _rows(5000, seed=5)
    spec = _spec(whole_word, mask_token_share=mask_share, random_token_share=random_share)
    out, positions, labels, per_row = mask_rows(ids, offsets, np.random.default_rng(6), spec)
    chosen = np.repeat(offsets[:-1], per_row) + positions
    now = out[chosen]
    is_mask = now == MASK
    replaced = (now != labels) & ~is_mask
    assert len(chosen) > 20000
    assert is_mask.mean() == pytest.approx(mask_share, abs=0.01)
    # a random replacement equals the original 1 time in 55: count it as kept
    assert replaced.mean() == pytest.approx(random_share * (1 - 1 / (VOCAB - 5)), abs=0.01)
    assert (now[replaced] >= spec.first_random_id).all()


def test_the_defaults_are_googles_80_10_10():
    spec = _spec()
    assert (spec.mask_token_share, 1.0 - spec.random_token_share) == (0.8, 0.9)


@pytest.mark.parametrize("shares", [(0.8, 0.3), (-0.1, 0.1), (0.5, -0.5)])
def test_shares_are_validated(shares):
    with pytest.raises(ValueError, match="each must be >= 0 and together at most 1"):
        _spec(mask_token_share=shares[0], random_token_share=shares[1])


def _reference_draws(ids, offsets, rng, spec):
    """The default (non-whole-word) draw order, written plainly: one float32 key per token,
    each row's ``num_to_predict`` smallest candidate keys, then one float64 roll per chosen
    position, then the random replacements. The examples stage's shards depend on exactly this."""
    keys = rng.random(len(ids), dtype=np.float32)
    chosen = []
    for r, want in enumerate(_want(offsets, spec)):
        cand = [i for i in range(offsets[r], offsets[r + 1]) if ids[i] not in spec.skipped_ids]
        chosen += sorted(sorted(cand, key=lambda i: keys[i])[:want])
    chosen = np.array(chosen, dtype=np.int64)
    out = ids.copy()
    roll = rng.random(len(chosen))
    out[chosen[roll < 0.8]] = spec.mask_id
    replace = chosen[roll >= 0.9]
    out[replace] = rng.integers(spec.first_random_id, spec.vocab_size, size=len(replace))
    return out, chosen


@pytest.mark.parametrize("mode", MaskingSpec.CANDIDATES)
def test_default_draws_are_pinned(mode):
    """A change to the default path's draws would change every static examples shard (and the
    lock): compare with the plain transcription above."""
    ids, offsets = _rows(400, seed=7)
    spec = _spec(never_masked=MaskingSpec.never_masked_ids(mode, SPECIAL_IDS))
    out, positions, labels, per_row = mask_rows(ids, offsets, np.random.default_rng(8), spec)
    ref_out, ref_chosen = _reference_draws(ids, offsets, np.random.default_rng(8), spec)
    assert np.array_equal(out, ref_out)
    assert np.array_equal(np.repeat(offsets[:-1], per_row) + positions, ref_chosen)
    assert np.array_equal(labels, ids[ref_chosen]) and labels.dtype == ids.dtype


@pytest.mark.parametrize("whole_word", [False, True])
def test_one_row_at_a_time_with_its_own_seed_is_batch_independent(whole_word):
    """Dynamic masking masks each row alone from an RNG seeded by (seed, split, epoch, row):
    the result for a row is the same whatever rows are masked around it."""
    ids, offsets = _rows(50, seed=9)
    spec = _spec(whole_word)

    def one(r):
        row = ids[offsets[r] : offsets[r + 1]]
        return mask_rows(row, np.array([0, len(row)]), np.random.default_rng([11, 0, 2, r]), spec)

    first = [one(r) for r in range(50)]
    again = [one(r) for r in reversed(range(50))][::-1]
    for a, b in zip(first, again):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("whole_word", [False, True])
def test_mask_candidates_google_includes_unk(whole_word):
    """Google skips only [CLS] and [SEP] (create_masked_lm_predictions, l. 348): [UNK] can be a
    prediction target. ``skip_special`` never picks a special id."""
    rng = np.random.default_rng(0)
    rows = [
        np.r_[CLS, rng.choice([UNK, 10, 11, 12, 13], size=20), SEP, rng.choice([UNK, 14, 15], size=12), SEP]
        for _ in range(400)
    ]
    ids = np.concatenate(rows).astype(np.uint16)
    offsets = np.r_[0, np.cumsum([len(r) for r in rows])]
    for mode in MaskingSpec.CANDIDATES:
        spec = MaskingSpec(
            50,
            MASK,
            tuple(SPECIAL_IDS.values()),
            0.15,
            20,
            whole_word,
            np.zeros(50, dtype=bool) if whole_word else None,
            never_masked=MaskingSpec.never_masked_ids(mode, SPECIAL_IDS),
        )
        labels = mask_rows(ids, offsets, rng, spec)[2]
        assert not np.isin(labels, [CLS, SEP]).any()
        unk_share = (labels == UNK).mean()
        if mode == "google":
            assert spec.skipped_ids == (CLS, SEP)
            assert 0.2 < unk_share < 0.45, unk_share  # [UNK] is ~1/4 of the candidates
        else:
            assert spec.skipped_ids == tuple(SPECIAL_IDS.values()) and unk_share == 0
