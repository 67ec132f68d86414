"""Streaming MLM/NSP batches from the examples shards (``data/examples/manifest.json``).

Memory stays bounded: the loader never reads a whole split. Its unit of reading is one
Parquet row group of one shard. Per epoch:

1. the list of all (shard, row group) units is permuted with an RNG seeded from
   ``(seed, epoch)`` (the same on every rank);
2. the rows of the units in that order are cut into ``world_size`` contiguous slices of
   ``rows // world_size`` rows, one per rank: DDP ranks read disjoint rows, equally many, and
   together all of them but the last ``rows % world_size`` (a rank shares at most the two row
   groups at its slice's ends with its neighbours, reading only its own rows of them). With one
   process the slice is every unit, whole;
3. each rank streams its slice's rows through a shuffle buffer of ``shuffle_buffer`` rows
   (the ``tf.data`` ``shuffle(buffer_size)`` algorithm: a full buffer emits a random row and
   takes the incoming one in its place; Google's ``run_pretraining.py`` shuffles files then
   uses a buffer the same way);
4. rows are cut into batches; every rank yields ``(rows // world_size) // batch_size``
   batches, so all ranks run the same number of steps (no DDP hang) and the tail is dropped.

The order of row *indices* in an epoch is a pure function of the manifest, the seed, the epoch
and the (rank, world size), computed from Parquet metadata alone. Resuming at
``(epoch, batches consumed)`` therefore replays only that index arithmetic and then reads the
row groups still needed: no decoding, masking or collation of the skipped batches.

Dynamic masking (manifest ``masking: dynamic``) masks each example on its own with
:func:`pipeline.data.masking.mask_rows` (the examples stage's static masking, one row at a time)
from an RNG seeded by ``(seed, split, epoch, row)``, where ``row`` is the example's index in its
split: masks change every epoch (RoBERTa, Liu et al. 2019, section 4.1) but are a function of
those four numbers and the row alone, never of ranks, batch size or composition, threads or
resuming.
Static masking uses the positions stored in the shards.

Packed causal-LM shards (manifest ``mode: causal``, :mod:`pipeline.data.packing`) go through the same
units, shuffle, DDP split and resume arithmetic; their rows are blocks of exactly ``max_seq_len``
ids (checked as read) and :func:`collate_packed` makes them a :class:`Batch` with an all-ones
attention mask and empty MLM/NSP fields.

Batches are padded to their longest sequence with ``[PAD]`` = 0; masked positions are flat
indices into the ``B * T`` tokens (what ``BertForPreTraining.forward`` gathers). Whether a
batch has padding at all is decided here, on the host (``Batch.padded``), so the model never
reads the mask back from the GPU to find out.

Integrity: :func:`verify_shards` rehashes the shards against the sha256s in the manifest (the
pretrain stage calls it before training). The loader itself checks each shard's columns when it
opens it, and each row group's token ids (``< vocab_size``), labels and positions as it reads
it, vectorised: a bad shard is a :class:`~pipeline.core.errors.BertraceError` naming the file, never
an IndexError deep inside the model.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline.core.errors import BertraceError
from pipeline.core.formats import (
    COLUMNS,
    EXAMPLE_MODES,
    MANIFEST,
    MASK_ID,
    PACKED_COLUMNS,
    SCHEMA_VERSION,
    SPECIAL_IDS,
    SPLIT_IDS,
    STATIC_COLUMNS,
)
from pipeline.core.io import read_json
from pipeline.data.masking import MaskingSpec, mask_rows

# ----------------------------------------------------------------------------- manifest


def load_manifest(examples_dir: str | Path) -> dict:
    """Read and sanity-check ``examples_dir/manifest.json``."""
    path = Path(examples_dir) / MANIFEST
    if not path.exists():
        raise BertraceError(f"{path}: not found; run the examples stage first (dvc repro examples)")
    manifest = read_json(path)
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise BertraceError(
            f"{path}: schema_version {manifest.get('schema_version')!r}, this code reads {SCHEMA_VERSION}; "
            "rerun the examples stage (dvc repro examples)"
        )
    for key in ("masking", "vocab_size", "splits", "tokenizer_sha256", "max_seq_len"):
        if key not in manifest:
            raise BertraceError(f"{path}: has no '{key}' field; rerun the examples stage (dvc repro examples)")
    if manifest_mode(manifest) not in EXAMPLE_MODES:
        raise BertraceError(
            f"{path}: mode {manifest.get('mode')!r} is not one of {', '.join(EXAMPLE_MODES)}; "
            "rerun the examples stage (dvc repro examples)"
        )
    if manifest_mode(manifest) == "causal":  # packed blocks (pipeline/data/packing.py): nothing is masked
        return manifest
    if manifest["masking"] not in ("static", "dynamic"):
        raise BertraceError(f"{path}: masking {manifest['masking']!r} is neither 'static' nor 'dynamic'")
    return manifest


def manifest_mode(manifest: dict) -> str:
    """``examples.mode`` the shards were made with: ``mlm_nsp`` or ``causal`` (absent: ``mlm_nsp``)."""
    return manifest.get("mode", "mlm_nsp")


def _sha256_counted(path: Path, update) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)  # releases the GIL: shards hash in parallel threads
            update(len(block))
    return h.hexdigest()


def verify_shards(
    examples_dir: str | Path, manifest: dict | None = None, *, progress: bool = False, threads: int | None = None
) -> int:
    """Rehash every shard listed in ``examples_dir/manifest.json`` against the sha256 recorded there.

    Catches a shard rewritten after the examples stage (same rows, different bytes), truncated or
    missing. Returns the number of shards checked; raises :class:`BertraceError` naming the first
    bad shard (and how many more) otherwise. ``progress``: a bar (on stderr) when it takes > 2 s.
    """
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    examples_dir = Path(examples_dir)
    manifest_path = examples_dir / MANIFEST
    if manifest is None:
        manifest = load_manifest(examples_dir)
    entries = [e for split in SPLIT_IDS for e in ((manifest["splits"].get(split) or {}).get("shards") or [])]
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("path"), str) or not isinstance(e.get("sha256"), str):
            raise BertraceError(
                f"{manifest_path}: a shard entry without 'path' and 'sha256' ({e!r}); "
                "rerun the examples stage (dvc repro examples)"
            )
    paths = [examples_dir / e["path"] for e in entries]
    total = sum(p.stat().st_size for p in paths if p.is_file())
    with (
        tqdm(
            total=total, unit="B", unit_scale=True, desc="verify shards", delay=2, leave=False, disable=not progress
        ) as bar,
        ThreadPoolExecutor(max_workers=threads or min(8, os.cpu_count() or 1)) as pool,
    ):
        actual = list(pool.map(lambda p: _sha256_counted(p, bar.update) if p.is_file() else None, paths))
    bad = [
        f"{p}: sha256 {now}, {manifest_path} records {e['sha256']}"
        if now
        else f"{p}: listed in {manifest_path} but missing"
        for p, e, now in zip(paths, entries, actual)
        if now != e["sha256"]
    ]
    if bad:
        more = f" (and {len(bad) - 1} more shard{'s' if len(bad) > 2 else ''})" if len(bad) > 1 else ""
        raise BertraceError(
            f"{bad[0]}{more}: the shards are not the ones the examples stage wrote (rewritten, truncated or "
            "removed since); rerun the examples stage (dvc repro examples, or dvc checkout data/examples)"
        )
    return len(entries)


def masking_spec(manifest: dict, is_continuation: np.ndarray | None = None) -> MaskingSpec:
    """The dynamic-masking recipe the examples stage recorded in its manifest."""
    wwm = bool(manifest.get("whole_word_masking", False))
    if wwm and is_continuation is None:
        raise BertraceError(
            "examples manifest asks for dynamic whole-word masking: pass the tokenizer "
            "(data/tokenizer/tokenizer.json) so the loader knows which pieces start with '##'"
        )
    # Which ids are never masked (examples.mask_candidates); manifests from before it was a
    # param have no key and skipped every special id.
    candidates = manifest.get("mask_candidates", "skip_special")
    if candidates not in MaskingSpec.CANDIDATES:
        raise BertraceError(
            f"examples manifest: mask_candidates {candidates!r} is not one of "
            f"{', '.join(MaskingSpec.CANDIDATES)}; rerun the examples stage (dvc repro examples)"
        )
    return MaskingSpec(
        vocab_size=int(manifest["vocab_size"]),
        mask_id=MASK_ID,
        special_ids=tuple(SPECIAL_IDS.values()),
        masked_lm_prob=float(manifest.get("masked_lm_prob", 0.15)),
        max_predictions_per_seq=int(manifest.get("max_predictions_per_seq", 20)),
        whole_word_masking=wwm,
        is_continuation=is_continuation if wwm else None,
        never_masked=MaskingSpec.never_masked_ids(candidates, SPECIAL_IDS),
    )


def continuation_table(tokenizer_json: str | Path) -> np.ndarray:
    """``is_continuation[id]``: True for WordPiece ``##`` pieces (for whole-word masking)."""
    from tokenizers import Tokenizer

    path = Path(tokenizer_json)
    if not path.is_file():
        raise BertraceError(f"{path}: tokenizer not found; run the tokenizer stage (dvc repro tokenizer)")
    tok = Tokenizer.from_file(str(path))
    vocab = tok.get_vocab(with_added_tokens=True)
    table = np.zeros(max(vocab.values()) + 1, dtype=bool)
    for piece, i in vocab.items():
        table[i] = piece.startswith("##")
    return table


# ----------------------------------------------------------------------------- batches


@dataclass
class Batch:
    """One padded batch. ``masked_positions`` index the flattened ``[B * T]`` tokens."""

    input_ids: torch.Tensor  # [B, T] long
    token_type_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long, 1 = real token, 0 = padding
    masked_positions: torch.Tensor  # [N] long, flat indices into B * T
    masked_lm_labels: torch.Tensor  # [N] long, original ids at those positions
    next_sentence_labels: torch.Tensor  # [B] long, 0 = IsNext, 1 = NotNext
    example_ids: torch.Tensor  # [B] long, row index of each example in its split
    # Host-side: False when no row is padded (the model then drops the mask, and SDPA may take
    # its fused kernels), True when some is (the mask is used as is); None: unknown, the model
    # checks the mask itself (a GPU→CPU sync). collate_examples() always knows.
    padded: bool | None = None

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens in the batch."""
        return int(self.attention_mask.sum())

    def _tensors(self, fn) -> "Batch":
        return replace(
            self,
            **{
                f.name: fn(getattr(self, f.name))
                for f in fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)
            },
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return self._tensors(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        return self._tensors(lambda t: t.pin_memory())


# One example as held in the shuffle buffer: (input_ids, token_type_ids, nsp, positions, labels).
_Row = tuple


def collate_examples(rows: list[_Row], example_ids: list[int]) -> Batch:
    """Pad ``rows`` (already masked) to the longest one and flatten the masked positions."""
    if rows and rows[0][1] is None:  # packed causal-LM blocks
        return collate_packed(rows, example_ids)
    B = len(rows)
    T = max(len(r[0]) for r in rows)
    ids = np.zeros((B, T), dtype=np.int64)
    types = np.zeros((B, T), dtype=np.int64)
    attn = np.zeros((B, T), dtype=np.int64)
    positions, labels = [], []
    for b, (row_ids, row_types, _, pos, lbl) in enumerate(rows):
        n = len(row_ids)
        ids[b, :n] = row_ids
        types[b, :n] = row_types
        attn[b, :n] = 1
        positions.append(np.asarray(pos, dtype=np.int64) + b * T)
        labels.append(np.asarray(lbl, dtype=np.int64))
    return Batch(
        input_ids=torch.from_numpy(ids),
        token_type_ids=torch.from_numpy(types),
        attention_mask=torch.from_numpy(attn),
        masked_positions=torch.from_numpy(np.concatenate(positions)),
        masked_lm_labels=torch.from_numpy(np.concatenate(labels)),
        next_sentence_labels=torch.tensor([r[2] for r in rows], dtype=torch.long),
        example_ids=torch.tensor(example_ids, dtype=torch.long),
        padded=any(len(r[0]) < T for r in rows),
    )


def collate_packed(rows: list[_Row], example_ids: list[int]) -> Batch:
    """Packed causal-LM blocks (``examples.mode: causal``), all ``max_seq_len`` long: the attention
    mask is all ones and the MLM/NSP fields are empty (the ``clm`` objective reads ``input_ids`` only)."""
    ids = torch.from_numpy(np.stack([np.asarray(r[0], dtype=np.int64) for r in rows]))
    empty = torch.zeros(0, dtype=torch.long)
    return Batch(
        input_ids=ids,
        token_type_ids=torch.zeros_like(ids),
        attention_mask=torch.ones_like(ids),
        masked_positions=empty,
        masked_lm_labels=empty,
        next_sentence_labels=empty,
        example_ids=torch.tensor(example_ids, dtype=torch.long),
        padded=False,
    )


# ----------------------------------------------------------------------------- the loader


@dataclass(frozen=True)
class _Unit:
    shard: int  # index into the split's shard list
    row_group: int
    start: int  # index of the unit's first row in the split
    rows: int


class PretrainingData:
    """Batches of one split of an examples directory, for one DDP rank.

    ``batch_size`` is the per-rank (micro-)batch. ``train_stream`` is the shuffled, endless
    training stream; ``eval_batches`` the fixed-order validation pass.
    """

    def __init__(
        self,
        examples_dir: str | Path,
        split: str = "train",
        *,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        shuffle_buffer: int = 10_000,
        is_continuation: np.ndarray | None = None,
    ):
        if split not in SPLIT_IDS:
            raise ValueError(f"split must be one of {list(SPLIT_IDS)}")
        if batch_size < 1:
            raise BertraceError(f"batch size {batch_size}: must be >= 1; fix pretrain.batch_size in params.yaml")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.dir = Path(examples_dir)
        self.manifest = load_manifest(self.dir)
        self.split = split
        self.split_id = SPLIT_IDS[split]
        self.batch_size = batch_size
        self.seed = int(seed)
        self.rank, self.world_size = rank, world_size
        self.shuffle_buffer = max(1, int(shuffle_buffer))
        self.mode = manifest_mode(self.manifest)  # causal: packed blocks, rows (ids, None, 0, None, None)
        self.dynamic = self.manifest["masking"] == "dynamic"
        self.spec = masking_spec(self.manifest, is_continuation) if self.dynamic else None
        self.shards, self.units = self._scan()
        self.rows = sum(u.rows for u in self.units)
        self._starts = np.array([u.start for u in self.units], dtype=np.int64)
        self._pq_cache: tuple[int, pq.ParquetFile] | None = None

    # -- metadata --------------------------------------------------------------------------
    def _scan(self) -> tuple[list[Path], list[_Unit]]:
        """Shard paths and their row groups, from the Parquet footers only."""
        info = self.manifest["splits"].get(self.split)
        manifest_path = self.dir / MANIFEST
        if not info or not info.get("shards"):
            raise BertraceError(f"{manifest_path}: no '{self.split}' shards; rerun the examples stage")
        shards, units, start = [], [], 0
        for s, entry in enumerate(info["shards"]):
            path = self.dir / entry["path"]
            if not path.is_file():
                raise BertraceError(
                    f"{path}: listed in {manifest_path} but missing; rerun the examples stage "
                    "(dvc repro examples, or dvc checkout data/examples)"
                )
            try:
                pf = pq.ParquetFile(path)
                meta, schema = pf.metadata, pf.schema_arrow
            except Exception as e:  # pyarrow raises ArrowInvalid/OSError on truncated files
                raise BertraceError(f"{path}: not a readable Parquet file ({e}); rerun the examples stage") from None
            self._check_schema(path, schema, manifest_path)
            if meta.num_rows != entry["rows"]:
                raise BertraceError(
                    f"{path}: has {meta.num_rows} rows, {manifest_path} says {entry['rows']}; "
                    "the shards and manifest are out of sync, rerun the examples stage"
                )
            for g in range(meta.num_row_groups):
                n = meta.row_group(g).num_rows
                if n:
                    units.append(_Unit(s, g, start, n))
                    start += n
            shards.append(path)
        return shards, units

    def _check_schema(self, path: Path, schema: pa.Schema, manifest_path: Path) -> None:
        """The columns the loader reads are there, as (lists of) integers."""
        wanted = PACKED_COLUMNS if self.mode == "causal" else COLUMNS + (() if self.dynamic else STATIC_COLUMNS)
        for name in wanted:
            if name not in schema.names:
                why = f" (masking: {self.manifest['masking']} in {manifest_path})" if name in STATIC_COLUMNS else ""
                raise BertraceError(
                    f"{path}: has no column '{name}'{why}; the shard is not one the examples stage "
                    "wrote, rerun it (dvc repro examples, or dvc checkout data/examples)"
                )
            t = schema.field(name).type
            ok = (
                pa.types.is_integer(t)
                if name == "next_sentence_label"
                else (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)
            )
            if not ok:
                raise BertraceError(
                    f"{path}: column '{name}' has type {t}, not the examples stage's "
                    f"{'integer' if name == 'next_sentence_label' else 'list of integers'}; "
                    "rerun the examples stage (dvc repro examples)"
                )

    def _epoch_units(self, epoch: int) -> list[tuple[_Unit, int, int]]:
        """This rank's ``(unit, first, end)`` for ``epoch`` in reading order: the rows ``first <=
        x < end`` (indices in the split) of each unit its slice covers (module docstring, step 2)."""
        order = np.random.default_rng([self.seed, self.split_id, epoch, 0]).permutation(len(self.units))
        per_rank = self.rows // self.world_size
        lo, hi = self.rank * per_rank, (self.rank + 1) * per_rank  # this rank's slice of the epoch's rows
        out, pos = [], 0
        for i in order:
            u = self.units[i]
            a, b = max(lo, pos), min(hi, pos + u.rows)
            if a < b:
                out.append((u, u.start + a - pos, u.start + b - pos))
            pos += u.rows
        return out

    def batches_per_epoch(self, epoch: int = 0) -> int:
        """Batches every rank yields in ``epoch`` (the same on every rank and in every epoch)."""
        n = (self.rows // self.world_size) // self.batch_size
        if n == 0:
            raise BertraceError(
                f"{self.dir}: a rank gets {self.rows // self.world_size} {self.split} examples per epoch, fewer "
                f"than the per-rank batch size {self.batch_size}; lower pretrain.batch_size or make more examples"
            )
        return n

    # -- reading ---------------------------------------------------------------------------
    def _read_unit(self, unit: _Unit) -> dict[int, _Row]:
        """All rows of one row group, keyed by their index in the split (copied, unmasked)."""
        path = self.shards[unit.shard]
        try:
            if self._pq_cache is None or self._pq_cache[0] != unit.shard:
                self._pq_cache = (unit.shard, pq.ParquetFile(path))
            table = self._pq_cache[1].read_row_group(unit.row_group)
        except Exception as e:  # pyarrow: ArrowInvalid / OSError on damaged pages
            raise BertraceError(
                f"{path}: row group {unit.row_group} is unreadable ({e}); the shard is damaged, "
                "rerun the examples stage (dvc repro examples, or dvc checkout data/examples)"
            ) from None

        def lists(name):
            col = table.column(name).combine_chunks()
            return col.values.to_numpy(zero_copy_only=False), col.offsets.to_numpy()

        if self.mode == "causal":
            return self._read_packed(unit, table)
        static = not self.dynamic
        for name in COLUMNS + (STATIC_COLUMNS if static else ()):
            if table.column(name).null_count:
                self._bad_rows(unit, f"nulls in column '{name}'")
        ids, offs = lists("input_ids")
        types, toffs = lists("token_type_ids")
        nsp = table.column("next_sentence_label").to_numpy()
        lengths = np.diff(offs)
        if not np.array_equal(lengths, np.diff(toffs)):
            self._bad_rows(unit, "rows whose token_type_ids and input_ids differ in length")
        if len(nsp) and not np.isin(nsp, (0, 1)).all():
            self._bad_rows(unit, f"next_sentence_label {int(nsp[~np.isin(nsp, (0, 1))][0])} (not 0 or 1)")
        self._check_ids(unit, ids, "input_ids")
        if static:
            pos, poffs = lists("masked_lm_positions")
            lbl, loffs = lists("masked_lm_ids")
            counts = np.diff(poffs)
            if not np.array_equal(counts, np.diff(loffs)):
                self._bad_rows(unit, "rows whose masked_lm_positions and masked_lm_ids differ in length")
            self._check_ids(unit, lbl, "masked_lm_ids")
            if len(pos) and (pos >= np.repeat(lengths, counts)).any():
                self._bad_rows(unit, "masked_lm_positions past the end of their row")
        rows = {}
        for r in range(unit.rows):
            a, b = offs[r], offs[r + 1]
            row = [ids[a:b].copy(), types[toffs[r] : toffs[r + 1]].copy(), int(nsp[r]), None, None]
            if static:
                row[3] = pos[poffs[r] : poffs[r + 1]].copy()
                row[4] = lbl[loffs[r] : loffs[r + 1]].copy()
            rows[unit.start + r] = row
        return rows

    def _read_packed(self, unit: _Unit, table: pa.Table) -> dict[int, _Row]:
        """The rows of one row group of packed blocks: each exactly ``max_seq_len`` ids."""
        if table.column("input_ids").null_count:
            self._bad_rows(unit, "nulls in column 'input_ids'")
        col = table.column("input_ids").combine_chunks()
        ids, offs = col.values.to_numpy(zero_copy_only=False), col.offsets.to_numpy()
        width = int(self.manifest["max_seq_len"])
        if len(offs) > 1 and not (np.diff(offs) == width).all():
            self._bad_rows(unit, f"blocks that are not max_seq_len {width} tokens long")
        self._check_ids(unit, ids, "input_ids")
        return {unit.start + r: (ids[offs[r] : offs[r + 1]].copy(), None, 0, None, None) for r in range(unit.rows)}

    def _check_ids(self, unit: _Unit, ids: np.ndarray, column: str) -> None:
        """Every token id is in ``[0, vocab_size)`` (else the embedding lookup fails much later)."""
        vocab = int(self.manifest["vocab_size"])
        if len(ids) and (int(ids.max()) >= vocab or int(ids.min()) < 0):
            bad = int(ids.max()) if int(ids.max()) >= vocab else int(ids.min())
            path = self.shards[unit.shard]
            raise BertraceError(
                f"{path}: row group {unit.row_group} has {column} id {bad}, outside the vocabulary "
                f"(vocab_size {vocab} in {self.dir / MANIFEST}); the shard was not made with this manifest's "
                "tokenizer, rerun the examples stage (dvc repro examples, or dvc checkout data/examples)"
            )

    def _bad_rows(self, unit: _Unit, what: str) -> None:
        raise BertraceError(
            f"{self.shards[unit.shard]}: row group {unit.row_group} has {what}; the shard is not one "
            "the examples stage wrote, rerun it (dvc repro examples, or dvc checkout data/examples)"
        )

    def _mask(self, row: list, example: int, epoch: int) -> _Row:
        if not self.dynamic:
            return tuple(row)
        rng = np.random.default_rng([self.seed, self.split_id, epoch, example])
        ids, pos, lbl, _ = mask_rows(row[0], np.array([0, len(row[0])]), rng, self.spec)
        return ids, row[1], row[2], pos, lbl

    def _unit_of(self, example: int) -> _Unit:
        return self.units[int(np.searchsorted(self._starts, example, side="right")) - 1]

    # -- the shuffled index stream --------------------------------------------------------
    def _index_stream(self, epoch: int) -> Iterator[tuple[tuple[_Unit, int, int] | None, list[int], list[int]]]:
        """Yield ``((unit, first, end), emitted, buffer)`` after the unit's rows ``first <= x < end``
        entered the shuffle buffer.

        ``emitted`` are the row indices the buffer gave out meanwhile (in order); ``buffer`` is
        the live buffer (read it before advancing). The last item has ``unit=None`` and holds
        the buffer's remaining rows in random order.
        """
        rng = np.random.default_rng([self.seed, self.split_id, epoch, 1 + self.rank])
        size = self.shuffle_buffer
        buf: list[int] = []
        for unit, first, end in self._epoch_units(epoch):
            emitted = []
            draws = rng.integers(0, size, size=end - first).tolist()  # one draw per incoming row
            for x, j in zip(range(first, end), draws):
                if len(buf) < size:
                    buf.append(x)
                else:
                    emitted.append(buf[j])
                    buf[j] = x
            yield (unit, first, end), emitted, buf
        yield None, [buf[i] for i in rng.permutation(len(buf))], []

    def train_stream(self, epoch: int = 0, skip_batches: int = 0) -> Iterator[tuple[int, int, Batch]]:
        """Endless ``(epoch, batch index in epoch, batch)`` from ``(epoch, skip_batches)`` on."""
        while True:
            for i, batch in enumerate(self.epoch_batches(epoch, skip_batches), start=skip_batches):
                yield epoch, i, batch
            epoch, skip_batches = epoch + 1, 0

    def epoch_batches(self, epoch: int, skip_batches: int = 0) -> Iterator[Batch]:
        """The batches of one epoch for this rank, the first ``skip_batches`` skipped cheaply."""
        n_batches = self.batches_per_epoch(epoch)
        if skip_batches >= n_batches:
            return
        skip = skip_batches * self.batch_size  # rows to pass over without reading them
        wanted = n_batches * self.batch_size
        seen = 0  # rows emitted by the shuffle buffer so far
        data: dict[int, list] = {}  # rows read and not yet emitted
        live = skip == 0
        pending_rows: list[_Row] = []
        pending_ids: list[int] = []
        for part, emitted, buf in self._index_stream(epoch):
            if live:
                if part is not None:
                    unit, first, end = part
                    rows = self._read_unit(unit)
                    if end - first < unit.rows:  # a row group shared with a neighbouring rank
                        rows = {x: rows[x] for x in range(first, end)}
                    data.update(rows)
            elif seen + len(emitted) > skip:
                # Resume point reached: read what the buffer and the rest of the epoch need.
                live = True
                emitted = emitted[skip - seen :]
                seen = skip
                need = set(emitted) | set(buf)
                for u in sorted({self._unit_of(x) for x in need}, key=lambda u: u.start):
                    data.update((k, v) for k, v in self._read_unit(u).items() if k in need)
            else:
                seen += len(emitted)
                continue
            for x in emitted:
                if seen >= wanted:
                    return
                pending_rows.append(self._mask(data.pop(x), x, epoch))
                pending_ids.append(x)
                seen += 1
                if len(pending_rows) == self.batch_size:
                    yield collate_examples(pending_rows, pending_ids)
                    pending_rows, pending_ids = [], []

    # -- validation -----------------------------------------------------------------------
    def eval_batches(self, max_batches: int | None = None, *, batch_rows: int | None = None) -> Iterator[Batch]:
        """Fixed-order batches of ``batch_size`` (file order; the last one may be short), batch
        ``i`` on rank ``i % world_size``, over the split's first ``max_batches * batch_rows``
        examples (all of them for None/0) in all ranks together. ``batch_rows`` (default
        ``batch_size * world_size``) is the global batch ``max_batches`` counts: pass the same
        one on any number of ranks and they evaluate the same examples. Dynamic masks are seeded
        as epoch 0, so every evaluation sees the same masks."""
        per = batch_rows or self.batch_size * self.world_size
        limit = self.rows if not max_batches else min(self.rows, max_batches * per)
        B, W, R = self.batch_size, self.world_size, self.rank
        rows: list[_Row] = []
        ids: list[int] = []
        for unit in self.units:
            if unit.start >= limit:
                break
            end = min(unit.start + unit.rows, limit)
            if not any(b % W == R for b in range(unit.start // B, (end - 1) // B + 1)):
                continue  # none of this rank's batches touch this row group
            data = self._read_unit(unit)
            for x in range(unit.start, end):
                if (x // B) % W != R:
                    continue
                rows.append(self._mask(data[x], x, 0))
                ids.append(x)
                if (x + 1) % B == 0 or x + 1 == limit:
                    yield collate_examples(rows, ids)
                    rows, ids = [], []


def prefetch(iterator: Iterable, depth: int = 2, pin: bool = False) -> Iterator:
    """Run ``iterator`` in a background thread, ``depth`` items ahead (order unchanged).

    Reading, masking and padding then overlap with the accelerator's work.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def work():
        try:
            for item in iterator:
                if pin and isinstance(item, tuple) and isinstance(item[-1], Batch):
                    item = (*item[:-1], item[-1].pin_memory())
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # hand the error to the consumer
            q.put(e)

    thread = threading.Thread(target=work, daemon=True, name="bertrace-prefetch")
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
