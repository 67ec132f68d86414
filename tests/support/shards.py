"""Hand-built example shards, correct and then broken one way each, for the validate suites."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.core.io import read_json, sha256_file, write_json
from pipeline.data.masking import MaskingSpec, mask_rows

VOCAB, MAX_LEN, MAX_PRED, PROB = 300, 32, 5, 0.15

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4

SPECIALS = {"[PAD]": PAD, "[UNK]": UNK, "[CLS]": CLS, "[SEP]": SEP, "[MASK]": MASK}

LAYOUT = {"train": [150, 150], "valid": [60]}  # rows per shard; train >= 200 rows -> NSP judged


def make_rows(n: int, seed: int, *, static: bool = True, prob: float = PROB) -> list[dict]:
    """``[CLS] A [SEP] B [SEP]`` rows with balanced NSP labels, masked with Google's recipe."""
    rng = np.random.default_rng(seed)
    spec = MaskingSpec(VOCAB, MASK, tuple(SPECIALS.values()), prob, MAX_PRED)
    rows = []
    for i in range(n):
        a = rng.integers(5, VOCAB, rng.integers(8, 15))
        b = rng.integers(5, VOCAB, rng.integers(8, 15))
        ids = np.concatenate([[CLS], a, [SEP], b, [SEP]]).astype(np.int64)
        row = {
            "input_ids": ids.tolist(),
            "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1),
            "next_sentence_label": i % 2,
        }
        if static:
            masked, pos, lab, _ = mask_rows(ids, np.array([0, len(ids)]), rng, spec)
            row.update(input_ids=masked.tolist(), masked_lm_positions=pos.tolist(), masked_lm_ids=lab.tolist())
        rows.append(row)
    return rows


def schema(static: bool) -> pa.Schema:
    fields = [
        ("input_ids", pa.list_(pa.uint16())),
        ("token_type_ids", pa.list_(pa.uint8())),
        ("next_sentence_label", pa.int8()),
    ]
    if static:
        fields += [("masked_lm_positions", pa.list_(pa.uint16())), ("masked_lm_ids", pa.list_(pa.uint16()))]
    return pa.schema(fields)


def write_shard(path: Path, rows: list[dict], static: bool, **kw) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema(static)), path, compression=kw.get("compression", "zstd"))


def write_examples(root: Path, *, static: bool = True, prob: float = PROB) -> Path:
    splits = {}
    seed = 0
    for split, sizes in LAYOUT.items():
        shards = []
        for k, n in enumerate(sizes):
            rel = f"{split}/shard-{k:05d}.parquet"
            write_shard(root / rel, make_rows(n, seed, static=static, prob=prob), static)
            seed += 1
            shards.append({"path": rel})
        splits[split] = {"documents": 10, "shards": shards}
    write_json(
        root / "manifest.json",
        {
            "schema_version": 1,
            "masking": "static" if static else "dynamic",
            "tokenizer_sha256": "0" * 64,
            "vocab_size": VOCAB,
            "special_ids": SPECIALS,
            "max_seq_len": MAX_LEN,
            "masked_lm_prob": PROB,
            "max_predictions_per_seq": MAX_PRED,
            "whole_word_masking": False,
            "seed": 1,
            "params": {},
            "inputs": {},
            "splits": splits,
        },
    )
    refresh_manifest(root)
    return root


def refresh_manifest(root: Path) -> None:
    """Recompute rows/tokens/sha256 of every listed shard (so only the planted defect shows)."""
    m = read_json(root / "manifest.json")
    for info in m["splits"].values():
        for s in info["shards"]:
            t = pq.read_table(root / s["path"])
            s.update(
                rows=t.num_rows,
                tokens=int(pc.sum(pc.list_value_length(t["input_ids"])).as_py()),
                sha256=sha256_file(root / s["path"]),
            )
        info["rows"] = sum(s["rows"] for s in info["shards"])
        info["tokens"] = sum(s["tokens"] for s in info["shards"])
    write_json(root / "manifest.json", m)


def rewrite(root: Path, rel: str, mutate) -> None:
    """Apply ``mutate(rows)`` to one shard, write it back (same schema), refresh the manifest."""
    path = root / rel
    rows = pq.read_table(path).to_pylist()
    mutate(rows)
    write_shard(path, rows, "masked_lm_ids" in rows[0])
    refresh_manifest(root)


def unmasked(row: dict, start: int = 1) -> int:
    """A position in segment A that is neither masked nor special."""
    pos = set(row["masked_lm_positions"])
    return next(i for i in range(start, len(row["input_ids"])) if i not in pos and row["input_ids"][i] > MASK)
