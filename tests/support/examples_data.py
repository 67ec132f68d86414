"""Synthetic MLM/NSP example shards (Parquet + manifest, as the examples stage writes them) for the
pre-training tests, and ways to corrupt one."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.data.masking import MaskingSpec, mask_rows

VOCAB = 128

FIRST = 5  # first non-special id

TOKENIZER_SHA = hashlib.sha256(b"tiny test tokenizer").hexdigest()


def _row(rng: np.random.Generator, max_len: int):
    """``[CLS] A [SEP] B [SEP]`` from a learnable grammar: tokens count up by one (mod the
    non-special range); B continues A (IsNext) or starts anywhere else (NotNext)."""
    n = int(rng.integers(8, max_len - 2))
    la = int(rng.integers(2, n - 1))
    lb = n - la
    start = int(rng.integers(0, VOCAB - FIRST))
    nsp = int(rng.random() < 0.5)
    a = [(start + k) % (VOCAB - FIRST) + FIRST for k in range(la)]
    b_start = start + la if nsp == 0 else start + la + int(rng.integers(3, VOCAB - FIRST - 3))
    b = [(b_start + k) % (VOCAB - FIRST) + FIRST for k in range(lb)]
    ids = np.array([2, *a, 3, *b, 3], dtype=np.uint16)
    types = np.array([0] * (la + 2) + [1] * (lb + 1), dtype=np.uint8)
    return ids, types, nsp


def _frozen_mask(ids: np.ndarray, rng: np.random.Generator, spec: MaskingSpec):
    """Frozen fixture recipe: the committed golden hashes (tests/support/golden/weights.json) were
    built with it; the pipeline's masking is :func:`pipeline.data.masking.mask_rows`.

    One row, ``num_to_predict`` positions from a permutation of the candidates, then one roll per
    position (``< 0.8`` ``[MASK]``, ``>= 0.9`` a random non-special id)."""
    candidates = np.flatnonzero(~np.isin(ids, spec.skipped_ids))
    if len(candidates) == 0:
        return ids.copy(), candidates, ids[:0].copy()
    num_to_predict = min(spec.max_predictions_per_seq, max(1, int(round(len(ids) * spec.masked_lm_prob))))
    positions = np.sort(rng.permutation(candidates)[:num_to_predict])
    out = ids.copy()
    roll = rng.random(len(positions))
    out[positions[roll < 0.8]] = spec.mask_id
    n_random = int((roll >= 0.9).sum())
    if n_random:
        out[positions[roll >= 0.9]] = rng.integers(spec.first_random_id, spec.vocab_size, size=n_random)
    return out, positions, ids[positions]


def _mask(ids: np.ndarray, rng: np.random.Generator, spec: MaskingSpec, frozen: bool):
    if frozen:
        return _frozen_mask(ids, rng, spec)
    return mask_rows(ids, np.array([0, len(ids)]), rng, spec)[:3]


def make_examples(
    out: Path,
    *,
    masking: str = "static",
    train_rows: int = 512,
    valid_rows: int = 96,
    rows_per_shard: int = 128,
    row_group_size: int = 32,
    max_len: int = 32,
    seed: int = 7,
    tokenizer_sha256: str = TOKENIZER_SHA,
    whole_word_masking: bool = False,
    frozen_masking: bool = True,
) -> Path:
    """Write ``out/{train,valid}/shard-*.parquet`` + ``out/manifest.json`` per SPEC.

    Static masks come from :func:`_frozen_mask` (the golden run's data, tests/support/golden.py)
    unless ``frozen_masking=False``: then from :func:`pipeline.data.masking.mask_rows`, row by row
    from the same Generator as the rows."""
    out = Path(out)
    spec = MaskingSpec(vocab_size=VOCAB, mask_id=4, special_ids=(0, 1, 2, 3, 4))
    rng = np.random.default_rng(seed)
    id_type = pa.uint16()
    cols = [
        pa.field("input_ids", pa.list_(id_type)),
        pa.field("token_type_ids", pa.list_(pa.uint8())),
        pa.field("next_sentence_label", pa.int8()),
    ]
    if masking == "static":
        cols += [pa.field("masked_lm_positions", pa.list_(pa.uint16())), pa.field("masked_lm_ids", pa.list_(id_type))]
    schema = pa.schema(cols)
    splits = {}
    for split, total in (("train", train_rows), ("valid", valid_rows)):
        shards, done, index = [], 0, 0
        while done < total:
            n = min(rows_per_shard, total - done)
            data = {
                "input_ids": [],
                "token_type_ids": [],
                "next_sentence_label": [],
                "masked_lm_positions": [],
                "masked_lm_ids": [],
            }
            tokens = 0
            for _ in range(n):
                ids, types, nsp = _row(rng, max_len)
                tokens += len(ids)
                if masking == "static":
                    ids_m, pos, lbl = _mask(ids, rng, spec, frozen_masking)
                    data["input_ids"].append(ids_m.astype(np.uint16))
                    data["masked_lm_positions"].append(pos.astype(np.uint16))
                    data["masked_lm_ids"].append(lbl.astype(np.uint16))
                else:
                    data["input_ids"].append(ids)
                data["token_type_ids"].append(types)
                data["next_sentence_label"].append(nsp)
            table = pa.table({f.name: data[f.name] for f in schema}, schema=schema)
            rel = f"{split}/shard-{index:05d}.parquet"
            (out / split).mkdir(parents=True, exist_ok=True)
            pq.write_table(table, out / rel, compression="zstd", row_group_size=row_group_size)
            sha = hashlib.sha256((out / rel).read_bytes()).hexdigest()
            shards.append({"path": rel, "rows": n, "tokens": tokens, "sha256": sha})
            done += n
            index += 1
        splits[split] = {
            "rows": total,
            "tokens": sum(s["tokens"] for s in shards),
            "documents": total,
            "shards": shards,
        }
    manifest = {
        "schema_version": 1,
        "masking": masking,
        "tokenizer_sha256": tokenizer_sha256,
        "vocab_size": VOCAB,
        "special_ids": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4},
        "max_seq_len": max_len,
        "masked_lm_prob": 0.15,
        "max_predictions_per_seq": 20,
        "whole_word_masking": whole_word_masking,
        "seed": seed,
        "params": {"masking": masking},
        "inputs": {},
        "splits": splits,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


def make_tokenizer(path: Path) -> Path:
    """A WordPiece ``tokenizer.json`` over the test vocabulary: ids divisible by 3 start a word,
    the others are ``##`` continuation pieces (so counting sequences form 1-3 piece words)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordPiece

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])}
    vocab.update({("" if i % 3 == 0 else "##") + f"w{i}": i for i in range(FIRST, VOCAB)})
    Tokenizer(WordPiece(vocab, unk_token="[UNK]")).save(str(path))
    return path


def rewrite_shard(path: Path, change) -> Path:
    """Rewrite a shard with pyarrow after ``change(table) -> table`` (same rows: the manifest's
    row count still matches, only the bytes differ)."""
    table = change(pq.read_table(path))
    pq.write_table(table, path, compression="zstd", row_group_size=32)
    return path


def set_column(table: pa.Table, name: str, values: list) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))


def flip_first_label(table: pa.Table) -> pa.Table:
    nsp = table.column("next_sentence_label").to_pylist()
    return set_column(table, "next_sentence_label", [1 - nsp[0], *nsp[1:]])


def truncate(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path
