"""Corpus partitions in, Parquet shard columns out: what the MLM / NSP example writer
(:mod:`pipeline.data.examples`) and the causal packer (:mod:`pipeline.data.packing`) share.

Documents are the non-blank lines of a clean split (``data/clean/{train,valid}.txt``); they are
put in a seeded order and cut into partitions of ``docs_per_shard`` documents, one shard each,
so the bytes depend on neither the worker count nor the engine (Google's
``create_pretraining_data.py`` shuffles ``all_documents`` once, l. 208). Columns are built from
numpy arrays without pandas.
"""

from __future__ import annotations

import array
import hashlib
from itertools import chain
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa

from pipeline.core.errors import BertraceError
from pipeline.core.formats import SPLIT_IDS, UNIGRAM_COUNTS


def id_dtype(vocab_size: int):
    """The narrowest unsigned dtype that holds every id of a ``vocab_size`` vocabulary."""
    return np.uint16 if vocab_size <= 65536 else np.uint32


_NUMPY_OF = {
    pa.int8(): np.int8,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.int32(): np.int32,
}


def arrow_array(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    """A numpy array as an Arrow array, zero-copy (``pa.array`` would import pandas: +0.25 s per process)."""
    values = np.ascontiguousarray(values, dtype=_NUMPY_OF[type_])
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)])


def list_column(values: np.ndarray, lengths_or_offsets: np.ndarray, dtype, *, offsets: bool) -> pa.ListArray:
    """A list<dtype> Arrow column from flat numpy values plus per-row lengths or offsets."""
    if offsets:
        offs = lengths_or_offsets.astype(np.int32)
    else:
        offs = np.zeros(len(lengths_or_offsets) + 1, dtype=np.int32)
        np.cumsum(lengths_or_offsets, out=offs[1:])
    return pa.ListArray.from_arrays(arrow_array(offs, pa.int32()), arrow_array(values, pa.from_numpy_dtype(dtype)))


# ----------------------------------------------------------------------------- corpus


def index_documents(path: Path) -> np.ndarray:
    """Byte offset of every document (non-blank line) of ``path``: 8 bytes per document."""
    starts = array.array("q")
    pos = 0
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                starts.append(pos)
            pos += len(line)
    return np.frombuffer(starts, dtype=np.int64) if len(starts) else np.zeros(0, dtype=np.int64)


def document_order(num_docs: int, seed: int, split: str, shuffle: bool) -> np.ndarray:
    """The order in which a split's documents are cut into partitions.

    ``shuffle``: a permutation seeded from ``(seed, split)`` only, the same for every dupe pass
    (Google shuffles ``all_documents`` once, l. 208, before its dupe loop), so it depends on
    neither ``workers`` nor the engine; otherwise file order.
    """
    if not shuffle:
        return np.arange(num_docs, dtype=np.int64)
    key = hashlib.sha256(f"bertrace-examples/{seed}/{split}/document-order".encode()).digest()
    return np.random.default_rng(int.from_bytes(key[:16], "little")).permutation(num_docs)


def partition_sizes(num_docs: int, docs_per_shard: int) -> list[int]:
    """Fixed partitions of the document order; a trailing one of < 2 documents joins the previous one."""
    sizes = [docs_per_shard] * (num_docs // docs_per_shard)
    rest = num_docs % docs_per_shard
    if rest:
        if rest < 2 and sizes:
            sizes[-1] += rest
        else:
            sizes.append(rest)
    return sizes


def read_partitions(path: Path, starts: np.ndarray, order: np.ndarray, sizes: list[int]) -> Iterator[list[str]]:
    """The documents of each partition, in ``order``; each partition read in file order by seeking."""

    def changed():
        return BertraceError(f"{path}: changed while being read; rerun the examples stage")

    stat = path.stat()
    lo = 0
    try:
        with open(path, "rb") as f:
            for size in sizes:
                where = starts[order[lo : lo + size]]
                lo += size
                docs: list[str] = [""] * size
                for k in np.argsort(where, kind="stable").tolist():
                    f.seek(int(where[k]))
                    line = f.readline()
                    if not line.strip():
                        raise changed()
                    docs[k] = line.decode("utf-8").strip()
                yield docs
    except UnicodeDecodeError as e:
        raise BertraceError(f"{path}: not valid UTF-8 ({e}); rerun the clean stage") from None
    now = path.stat()
    if (now.st_size, now.st_mtime_ns) != (stat.st_size, stat.st_mtime_ns):
        raise changed()


def remove_stale(out_dir: Path):
    """Delete an examples directory's manifest, unigram counts and shards (and temporaries) before a rebuild."""
    (out_dir / "manifest.json").unlink(missing_ok=True)
    (out_dir / UNIGRAM_COUNTS).unlink(missing_ok=True)  # written by examples.mode: causal (pipeline/data/packing.py)
    for split in SPLIT_IDS:
        d = out_dir / split
        if d.is_dir():
            for f in chain(d.glob("shard-*.parquet"), d.glob(".shard-*.tmp")):
                f.unlink()


_FINGERPRINTS: dict[tuple[str, ...], str] = {}


def code_fingerprint(modules: tuple[str, ...]) -> str:
    """Hash of ``modules``' source and of the numpy, pyarrow and tokenizers versions: what decides a
    writer's shard bytes, compared on every Dask worker (:func:`check_worker_code`)."""
    if modules not in _FINGERPRINTS:
        import sys

        import tokenizers

        h = hashlib.sha256()
        for name in modules:
            h.update(Path(sys.modules[name].__file__).read_bytes())
        h.update(f"{np.__version__} {pa.__version__} {tokenizers.__version__}".encode())
        _FINGERPRINTS[modules] = h.hexdigest()
    return _FINGERPRINTS[modules]


def check_worker_code(client_fingerprint: str, modules: tuple[str, ...]) -> None:
    """Fail when this worker's code or libraries differ from the client's (other bytes would follow)."""
    here = code_fingerprint(modules)
    if client_fingerprint != here:
        raise BertraceError(
            "examples: this worker runs other bertrace code or library versions than the client "
            f"(fingerprint {here[:12]} != {client_fingerprint[:12]}); install the same "
            "bertrace, numpy, pyarrow and tokenizers on every Dask worker"
        )
