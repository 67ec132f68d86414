"""Causal-LM examples (``examples.mode: causal``): documents packed into blocks of ``max_seq_len``.

nanoGPT / GPT-2 style (Radford et al. 2019; Karpathy's ``nanoGPT/data/openwebtext/prepare.py``):
every document (one line of the clean corpus) is WordPiece'd whole (:class:`pipeline.data.encode.SentenceEncoder`,
exactly ``Tokenizer.encode``'s ids, no special tokens) and followed by one separator token, the
documents of a partition are concatenated in order into one token stream, and the stream is cut
into contiguous blocks of exactly ``max_seq_len`` tokens. No NSP, no masks, no padding: the
pre-training loader's attention mask is all ones and the loss is next-token prediction at every
position of a block.

* **Separator.** ``[SEP]`` (:data:`pipeline.core.formats.SEP_ID`, :data:`SEPARATOR_ID`), GPT-2's
  ``<|endoftext|>`` in its role: it *ends* every document, so the stream is
  ``d1 [SEP] d2 [SEP] ...`` and the model learns to predict the end of a document and, after a
  ``[SEP]``, the start of the next. The WordPiece vocabulary already has it (a dedicated token
  would change the tokenizer stage), and fine-tuning's ``[CLS] text [SEP]`` then ends on the token
  the decoder saw at every document end, where last-token pooling reads it. A document that
  tokenizes to nothing is dropped (no separator), so two separators are never adjacent.
* **Shards, determinism.** The documents are put in the same seeded order and cut into the same
  partitions of ``docs_per_shard`` documents as the MLM examples (:func:`pipeline.data.shards.document_order`,
  :func:`pipeline.data.shards.partition_sizes`); each partition is packed on its own into one shard
  ``shard-{partition:05d}.parquet``. Packing draws no random numbers, so the bytes depend on the
  corpus, tokenizer and recipe only: byte-identical for any number of workers and either engine.
  A block never spans two shards: the **tail** of a partition's stream (fewer than
  ``max_seq_len`` tokens, recorded per split as ``dropped_tokens``) is **dropped**, not padded, so
  every block is all real tokens. A partition shorter than one block writes no shard.
  ``dupe_factor`` / ``valid_dupe_factor`` (MLM re-pairing and re-masking) do not apply: the loader's
  epochs repeat the blocks.
* **Bits per byte.** Per split the manifest keeps ``text_bytes`` (UTF-8 bytes of the packed
  documents, plus one byte per document for the newline that ended its line: what the separator
  token stands for) and ``stream_tokens`` (document tokens plus separators, before the tail is
  dropped); ``bytes_per_token = text_bytes / stream_tokens``. A loss of ``L`` nats per token is
  ``L / ln 2 / bytes_per_token`` bits per byte (comparable across tokenizers).
* **Unigram baseline.** The training split's token counts (the blocks actually written) are
  stored as ``unigram_counts.npy`` (int64, one per id, sha256 in the manifest) so pre-training
  can report the cross entropy of an add-one-smoothed unigram model on exactly the validation
  targets it scores; the manifest also keeps that baseline on the whole validation split.

Parquet schema: ``input_ids: list<uint16|uint32>`` only (:data:`pipeline.core.formats.PACKED_COLUMNS`).
The manifest has ``mode: causal`` and the same ``splits.*.shards`` entries as the MLM one.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from pipeline.data.engine import Engine, run_tasks
from pipeline.data.encode import SentenceEncoder
from pipeline.core.errors import BertraceError
from pipeline.core.formats import PACKED_COLUMNS, SCHEMA_VERSION, SEP_ID, SPECIAL_IDS, SPLIT_IDS, UNIGRAM_COUNTS
from pipeline.core.io import atomic_path, sha256_bytes, sha256_file, write_json
from pipeline.data import shards
from pipeline.data.shards import (
    document_order,
    id_dtype,
    index_documents,
    list_column,
    partition_sizes,
    read_partitions,
    remove_stale,
)
from pipeline.data.tokenizer import load_tokenizer

SEPARATOR_ID = SEP_ID  # ends every document in the packed stream (module docstring)


def pack_documents(docs: list[str], encoder: SentenceEncoder, block: int) -> tuple[np.ndarray, dict[str, int]]:
    """The ``[n, block]`` blocks of one partition and its counts (module docstring).

    Each document's ids are followed by :data:`SEPARATOR_ID`; documents without tokens are left
    out; the stream's last ``len % block`` tokens are dropped."""
    ids, lengths = encoder.encode(docs)
    keep = lengths > 0
    n_docs = int(keep.sum())
    lengths = lengths[keep]
    # Insert one separator after each kept document: document k's tokens move right by k.
    total = int(lengths.sum()) + n_docs
    stream = np.empty(total, dtype=ids.dtype)
    ends = np.cumsum(lengths + 1) - 1  # where each document's separator goes
    is_sep = np.zeros(total, dtype=bool)
    is_sep[ends] = True
    stream[is_sep] = SEPARATOR_ID
    stream[~is_sep] = ids
    n_blocks = total // block
    text_bytes = sum(len(d.encode("utf-8")) + 1 for d, k in zip(docs, keep.tolist()) if k)
    stats = {
        "documents": n_docs,
        "stream_tokens": total,
        "dropped_tokens": total - n_blocks * block,
        "text_bytes": text_bytes,
    }
    return stream[: n_blocks * block].reshape(n_blocks, block), stats


def packed_schema(id_dtype) -> pa.Schema:
    return pa.schema([pa.field(PACKED_COLUMNS[0], pa.list_(pa.from_numpy_dtype(id_dtype)))])


def _blocks_table(blocks: np.ndarray, schema: pa.Schema) -> pa.Table:

    n, width = blocks.shape
    offsets = np.arange(n + 1, dtype=np.int64) * width
    return pa.Table.from_arrays([list_column(blocks.ravel(), offsets, blocks.dtype, offsets=True)], schema=schema)


class _Packer:
    """One process's tokenizer and config; turns a partition into one shard's bytes."""

    def __init__(self, tokenizer_text: str, cfg):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_str(tokenizer_text)
        self.cfg = cfg
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.id_dtype = id_dtype(self.vocab_size)
        self.schema = packed_schema(self.id_dtype)
        self.encoder = SentenceEncoder(self.tok, self.id_dtype)

    def process(self, split: str, partition: int, docs: list[str]) -> tuple[dict, bytes | None, np.ndarray]:
        """``(stats, parquet bytes or None when no full block, token counts per id)``."""
        blocks, stats = pack_documents(docs, self.encoder, self.cfg.max_seq_len)
        counts = np.bincount(blocks.ravel(), minlength=self.vocab_size).astype(np.int64)
        stats.update(
            split=split,
            index=partition,
            path=f"{split}/shard-{partition:05d}.parquet",
            rows=len(blocks),
            tokens=int(blocks.size),
            separators=int((blocks == SEPARATOR_ID).sum()),
        )
        if not len(blocks):
            return stats, None, counts
        sink = pa.BufferOutputStream()
        pq.write_table(
            _blocks_table(blocks, self.schema),
            sink,
            compression="zstd",
            row_group_size=self.cfg.row_group_size,
            use_dictionary=False,
            write_statistics=False,
        )
        data = sink.getvalue().to_pybytes()
        stats["sha256"] = sha256_bytes(data)
        return stats, data, counts


_PACKERS: dict[tuple, _Packer] = {}


def _pack_task(shared: tuple, split: str, partition: int, docs: list[str]):
    """One task of :func:`generate_packed` (a pool process or a Dask worker)."""
    tokenizer_text, tokenizer_sha, cfg, fingerprint, limit_threads = shared
    if limit_threads:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    shards.check_worker_code(fingerprint, CODE_MODULES)
    key = (tokenizer_sha, repr(cfg.recipe()))
    if key not in _PACKERS:
        _PACKERS.clear()
        _PACKERS[key] = _Packer(tokenizer_text, cfg)
    return _PACKERS[key].process(split, partition, docs)


# the modules whose source decides the packed bytes (with the library versions)
CODE_MODULES = ("pipeline.data.packing", "pipeline.data.shards", "pipeline.data.encode", "pipeline.core.formats")


def code_fingerprint() -> str:
    """Hash of the code and library versions that determine the packed bytes (checked on Dask workers)."""
    return shards.code_fingerprint(CODE_MODULES)


def unigram_cross_entropy(train_counts: np.ndarray, eval_counts: np.ndarray) -> float:
    """Nats per token of the add-one-smoothed unigram model of ``train_counts`` on tokens
    distributed as ``eval_counts`` (Laplace smoothing: an id unseen in training is not infinitely
    surprising)."""
    p = (train_counts.astype(np.float64) + 1.0) / (float(train_counts.sum()) + len(train_counts))
    n = float(eval_counts.sum())
    return float(-(eval_counts * np.log(p)).sum() / n) if n else float("nan")


def generate_packed(
    train_txt: Path, valid_txt: Path, tokenizer_json: Path, out_dir: Path, cfg, *, engine: Engine, progress: bool = True
) -> dict:
    """Write packed train/valid shards, ``unigram_counts.npy`` and ``manifest.json``; return the manifest.

    Called by :func:`pipeline.data.examples.generate_examples` for ``examples.mode: causal`` (same
    arguments, same engines, same corpus reading)."""

    tok = load_tokenizer(tokenizer_json)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    tokenizer_text = tokenizer_json.read_text(encoding="utf-8") if tokenizer_json.is_file() else tok.to_str()
    inputs = {"train.txt": train_txt, "valid.txt": valid_txt}
    starts = {}
    for split, path in zip(SPLIT_IDS, inputs.values()):
        if not path.is_file():
            raise BertraceError(f"{path}: {split} corpus not found; run the clean stage first (dvc repro clean)")
        starts[split] = index_documents(path)
        if len(starts[split]) == 0:
            raise BertraceError(f"{path}: the {split} corpus has no documents; check the clean stage's min_chars")
    num_docs = {split: len(v) for split, v in starts.items()}
    sizes = {split: partition_sizes(num_docs[split], cfg.docs_per_shard) for split in SPLIT_IDS}
    n_tasks = sum(len(v) for v in sizes.values())
    if engine.kind == "local":
        engine = Engine("local", min(engine.local_workers, n_tasks))
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale(out_dir)
    (out_dir / UNIGRAM_COUNTS).unlink(missing_ok=True)
    tasks = (
        (split, p, docs)
        for split, path in zip(SPLIT_IDS, inputs.values())
        for p, docs in enumerate(
            read_partitions(
                path,
                starts[split],
                document_order(num_docs[split], cfg.seed, split, cfg.shuffle_documents),
                sizes[split],
            )
        )
    )
    parallel = engine.kind == "dask" or engine.local_workers > 1
    shared = (tokenizer_text, sha256_bytes(tokenizer_text.encode("utf-8")), cfg, code_fingerprint(), parallel)

    results: list[dict] = []
    counts = {split: np.zeros(vocab_size, dtype=np.int64) for split in SPLIT_IDS}
    with tqdm(total=sum(num_docs.values()), unit="doc", desc="examples (causal)", disable=not progress) as bar:
        for (split, _, docs), (stats, data, c) in run_tasks(_pack_task, shared, tasks, engine, what="examples"):
            if data is not None:
                with atomic_path(out_dir / stats["path"]) as tmp:
                    tmp.write_bytes(data)
            counts[split] += c
            results.append(stats)
            bar.update(len(docs))
    _PACKERS.clear()

    splits = {}
    for split in SPLIT_IDS:
        parts = sorted((r for r in results if r["split"] == split), key=lambda r: r["index"])
        shards = [r for r in parts if r["rows"]]
        rows = sum(s["rows"] for s in shards)
        if rows == 0:
            longest = max((r["stream_tokens"] for r in parts), default=0)
            raise BertraceError(
                f"{inputs[split + '.txt']}: produced no {split} blocks: no partition of examples.docs_per_shard "
                f"{cfg.docs_per_shard} documents holds examples.max_seq_len {cfg.max_seq_len} tokens (the longest "
                f"has {longest}); lower examples.max_seq_len, raise examples.docs_per_shard or give the clean "
                "stage more text"
            )
        total = lambda key: sum(r[key] for r in parts)  # noqa: E731, B023 (called within the iteration)
        splits[split] = {
            "rows": rows,
            "tokens": rows * cfg.max_seq_len,
            "documents": num_docs[split],
            "packed_documents": total("documents"),
            "separators": total("separators"),
            "stream_tokens": total("stream_tokens"),
            "dropped_tokens": total("dropped_tokens"),
            "text_bytes": total("text_bytes"),
            "bytes_per_token": total("text_bytes") / max(total("stream_tokens"), 1),
            "shards": [{k: s[k] for k in ("path", "rows", "tokens", "sha256")} for s in shards],
        }

    with atomic_path(out_dir / UNIGRAM_COUNTS) as tmp, open(tmp, "wb") as f:
        np.save(f, counts["train"], allow_pickle=False)
    baseline = unigram_cross_entropy(counts["train"], counts["valid"])
    tokenizer_sha = sha256_file(tokenizer_json)
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "mode": "causal",
        "masking": "none",
        "tokenizer_sha256": tokenizer_sha,
        "vocab_size": vocab_size,
        "special_ids": dict(SPECIAL_IDS),
        "separator_id": SEPARATOR_ID,
        "max_seq_len": cfg.max_seq_len,
        "tail": "dropped",  # a partition's last < max_seq_len tokens; never padded, never carried over
        "shuffle_documents": cfg.shuffle_documents,
        "seed": cfg.seed,
        "params": cfg.recipe(),
        "inputs": {
            "train.txt": sha256_file(train_txt),
            "valid.txt": sha256_file(valid_txt),
            "tokenizer.json": tokenizer_sha,
        },
        "unigram": {
            "path": UNIGRAM_COUNTS,
            "sha256": sha256_file(out_dir / UNIGRAM_COUNTS),
            "smoothing": "add-one",
            "valid_nats_per_token": baseline,
            "valid_bits_per_byte": baseline / math.log(2) / splits["valid"]["bytes_per_token"],
        },
        "splits": splits,
    }
    write_json(out_dir / "manifest.json", manifest)
    return manifest
