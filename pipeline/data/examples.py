"""MLM + NSP pre-training examples: Google's ``create_pretraining_data.py`` recipe, sharded.

Line numbers ("l. N") refer to google-research/bert@eedf571 ``create_pretraining_data.py``.
Every deliberate difference from it is listed in docs/recipe.md.

Per document (one line of the clean corpus), following ``create_instances_from_document``:

1. split it into sentences (:func:`pipeline.data.sentences.split_sentences`) and WordPiece them
   (:class:`pipeline.data.encode.SentenceEncoder`: exactly ``Tokenizer.encode``'s ids, no special
   tokens, each distinct space-separated chunk tokenized once); sentences with no tokens are dropped;
2. draw a target length: ``max_seq_len - 3`` (room for ``[CLS] [SEP] [SEP]``), or with
   probability ``short_seq_prob`` a random one in ``[2, max_seq_len - 3]`` (once per
   document, as Google does);
3. gather sentences into a chunk until it reaches the target (or the document ends); the
   first ``a_end`` (random, ``1..len(chunk)-1``) sentences are segment A;
4. B is the rest of the chunk (IsNext), or with probability 0.5 (always when the chunk has a
   single sentence) sentences from a random start in a random *other* document (NotNext),
   in which case the chunk's unused sentences are put back (``i -= num_unused_segments``);
5. ``truncate_seq_pair`` (l. 418): drop tokens from the longer side (B on ties), each from the
   front or the back with probability 0.5, until ``len(A) + len(B) <= max_seq_len - 3``;
6. ``[CLS] A [SEP] B [SEP]``; static masking corrupts it here
   (:func:`pipeline.data.masking.mask_rows`, all rows of a shard at once; candidates per
   ``mask_candidates``), dynamic masking leaves that to the loader.

``dupe_factor`` (train) / ``valid_dupe_factor`` (valid) passes over the corpus, each with
its own pairing and masking.

Sharding, determinism, memory. With ``shuffle_documents`` (default) the documents of a split
are put in a seeded random order first, as Google shuffles ``all_documents`` (l. 208): a
permutation of the document *indices* (:func:`document_order`, seeded from ``(seed, split)``
only), so that related articles, which sit next to each other in Wikipedia's order, do not
share a partition. This process indexes the corpus once (8 bytes per document: where each line
starts) and then reads each partition's documents by seeking, so the text is never all in memory.
The order is cut into partitions of ``docs_per_shard`` documents (a trailing partition of fewer
than 2 documents joins the previous one). Each partition is tokenized once and, for every dupe
pass ``d``, written to its own shard ``shard-{partition * dupes + d:05d}.parquet`` using RNGs
seeded only from ``(seed, split, partition, d)``. NotNext documents are drawn from the same
partition; a partition with a single usable document (the others tokenize to nothing) draws them
from the first :data:`RESERVE_DOCS` documents of a neighbouring partition, sent with its task
(a lone document with no usable neighbour either makes no pairs: IsNext-only pairs would skew the
labels). Shards are therefore byte-identical for any number of worker processes and for either
engine (:mod:`pipeline.data.engine`: local processes or a Dask cluster); workers return the shard
bytes and the main process, which holds at most ``2 * workers + 1`` partitions at a time, writes them.

Deviations from Google, on purpose (all of them, with the measurements: docs/recipe.md):
* Google shuffles all instances of the corpus at once; we shuffle the instances within each
  shard and the loader shuffles the shard order (bounded memory, parallel writing).
* The random document is drawn uniformly among the *other* documents of the partition
  (Google: among all documents, 10 tries to avoid the same one, then gives up, l. 279), so
  NotNext B never comes from A's document. The pool of negatives is the partition (of
  shuffled documents), not the whole corpus.
* Truncation draws the final front/back split directly (a binomial over the number of
  tokens removed from each side), which has the same distribution as Google's
  token-at-a-time loop (l. 430-433).
* Static masking is drawn for a whole shard at once by :func:`pipeline.data.masking.mask_rows`
  (the loader's dynamic masking calls it on one row at a time). See :mod:`pipeline.data.masking`
  for how the recipe itself differs from Google's (random replacements exclude special ids).
* The pairing loop draws from a ``random.Random`` (cheap scalar draws); the shard shuffle and
  masking from a numpy Generator. Both are seeded from ``(seed, split, partition, dupe)``.
"""

from __future__ import annotations

import hashlib
import os
import random
from itertools import chain
from pathlib import Path
from typing import Annotated, Any, ClassVar, Iterator, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, ValidationError, model_validator
from tqdm import tqdm

from pipeline.core.config import Bool, Float, Int, format_errors
from pipeline.data.engine import Engine, EngineParams, run_tasks
from pipeline.data.encode import SentenceEncoder
from pipeline.core.errors import BertraceError
from pipeline.core.formats import CLS_ID, MASK_ID, SCHEMA_VERSION, SEP_ID, SPECIAL_IDS, SPLIT_IDS
from pipeline.core.io import atomic_path, sha256_bytes, sha256_file, write_json
from pipeline.data.masking import MaskingSpec, mask_rows
from pipeline.data.packing import generate_packed
from pipeline.data.sentences import split_sentences
from pipeline.data import shards
from pipeline.data.shards import (
    arrow_array,
    document_order,
    id_dtype,
    index_documents,
    list_column,
    partition_sizes,
    read_partitions,
    remove_stale,
)
from pipeline.data.tokenizer import load_tokenizer

ENGINE_KEYS = tuple(EngineParams.model_fields)  # workers, engine, dask_scheduler: never change the bytes
MIN_NSP_SEQ_LEN = 32  # shortest mlm_nsp example: room for two sentences of a few words
RESERVE_DOCS = 4  # documents of a neighbouring partition sent with each task (NotNext source of a lone document)

class ExamplesConfig(EngineParams):
    """The ``examples`` section of params.yaml; defaults equal params.yaml.

    The engine keys (:data:`ENGINE_KEYS`, from :class:`pipeline.data.engine.EngineParams`) are
    accepted but only set speed: :meth:`recipe` (the manifest's ``params``) and the worker
    cache leave them out. A bad value raises :class:`BertraceError` naming ``examples.key``,
    from :meth:`from_params` and from keyword construction alike.
    """

    SECTION: ClassVar[str] = "examples"

    # mlm_nsp: Google's recipe below; causal: documents packed into blocks of max_seq_len (pipeline/data/packing.py),
    # for which only max_seq_len, shuffle_documents, docs_per_shard, row_group_size and seed matter
    mode: Literal["mlm_nsp", "causal"] = "mlm_nsp"
    max_seq_len: Annotated[Int, Field(ge=8, le=65535)] = 128
    short_seq_prob: Annotated[Float, Field(ge=0, le=1)] = 0.1
    masked_lm_prob: Annotated[Float, Field(gt=0, lt=1)] = 0.15
    max_predictions_per_seq: Annotated[Int, Field(ge=1)] = 20
    dupe_factor: Annotated[Int, Field(ge=1)] = 2
    valid_dupe_factor: Annotated[Int, Field(ge=1)] = 1
    masking: Literal["static", "dynamic"] = "static"
    whole_word_masking: Bool = False
    mask_candidates: Literal["google", "skip_special"] = "google"  # google: only [CLS]/[SEP] are never masked
    shuffle_documents: Bool = True  # seeded document order before partitioning (Google l. 208)
    docs_per_shard: Annotated[Int, Field(ge=2, description="NSP negatives come from the same shard")] = 256
    row_group_size: Annotated[Int, Field(ge=1)] = 512
    seed: Annotated[Int, Field(ge=0)] = 12345

    def __init__(self, **data: Any):
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise BertraceError(format_errors(e, type(self), self.SECTION, "params.yaml")) from None

    @model_validator(mode="after")
    def _room_for_two_sentences(self) -> "ExamplesConfig":
        """Google's recipe pairs a chunk of one segment with a random B (label 1), so a pair of a
        few WordPieces, which rarely holds two sentences, leaves next-sentence prediction almost
        only random B's: on the default IMDB corpus 99 % at 8, 91 % at 16, 72 % at 32, 57 % at 128."""
        if self.mode == "mlm_nsp" and self.max_seq_len < MIN_NSP_SEQ_LEN:
            raise BertraceError(
                f"params.yaml: examples.max_seq_len = {self.max_seq_len}: too short for MLM/NSP examples; a pair of "
                f"{self.max_seq_len - 3} WordPieces rarely holds two sentences, so next-sentence prediction gets almost "
                f"only random B's (label 1); use at least {MIN_NSP_SEQ_LEN} (BERT: 128, then 512), or "
                "examples.mode: causal for short blocks"
            )
        return self

    def recipe(self) -> dict:
        """The params that determine the output bytes (the engine keys left out)."""
        return self.model_dump(include=set(self.recipe_keys()))


# ----------------------------------------------------------------------------- tokenizer


def _masking_spec(tok, cfg: ExamplesConfig) -> MaskingSpec:
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    is_cont = None
    if cfg.whole_word_masking:
        is_cont = np.zeros(vocab_size, dtype=bool)
        for piece, i in tok.get_vocab(with_added_tokens=True).items():
            if piece.startswith("##"):
                is_cont[i] = True
    return MaskingSpec(
        vocab_size=vocab_size,
        mask_id=MASK_ID,
        special_ids=tuple(SPECIAL_IDS.values()),
        masked_lm_prob=cfg.masked_lm_prob,
        max_predictions_per_seq=cfg.max_predictions_per_seq,
        whole_word_masking=cfg.whole_word_masking,
        is_continuation=is_cont,
        never_masked=MaskingSpec.never_masked_ids(cfg.mask_candidates, SPECIAL_IDS),
    )


# ----------------------------------------------------------------------------- one partition


def truncation_amounts(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """How many tokens Google's ``truncate_seq_pair`` (l. 418-433) removes from A and from B.

    It pops from ``tokens_a if len(tokens_a) > len(tokens_b) else tokens_b`` (l. 425: B on
    ties) until the pair fits; the result depends only on the lengths, so we compute it in
    closed form. With 125 usable tokens a pair trimmed on both sides ends 63/62 (A/B).
    """
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0
    gap = abs(len_a - len_b)
    if excess <= gap:
        return (excess, 0) if len_a > len_b else (0, excess)
    rest = excess - gap  # sides are equal now; B goes first on ties, then they alternate
    if len_a > len_b:
        return gap + rest // 2, (rest + 1) // 2
    return rest // 2, gap + (rest + 1) // 2


def truncate_pair(
    a_lo: int, a_hi: int, b_lo: int, b_hi: int, max_num_tokens: int, rng: random.Random
) -> tuple[int, int, int, int]:
    """``truncate_seq_pair`` on the spans ``[a_lo, a_hi)`` and ``[b_lo, b_hi)``.

    Google removes each token from the front or the back with probability 0.5 (l. 430-433),
    so the number taken from the front of a side is Binomial(cut, 0.5): one draw of ``cut``
    random bits per side instead of one per token.
    """
    cut_a, cut_b = truncation_amounts(a_hi - a_lo, b_hi - b_lo, max_num_tokens)
    if cut_a:
        front = rng.getrandbits(cut_a).bit_count()
        a_lo, a_hi = a_lo + front, a_hi - (cut_a - front)
    if cut_b:
        front = rng.getrandbits(cut_b).bit_count()
        b_lo, b_hi = b_lo + front, b_hi - (cut_b - front)
    return a_lo, a_hi, b_lo, b_hi


class _Partition:
    """Sentences of one partition's documents as one flat token array.

    Sentence ``j`` is ``tokens[off[j]:off[j+1]]``; document ``d`` is sentences
    ``doc_first[d] .. doc_first[d] + doc_n[d] - 1``. A document's sentences are contiguous,
    so every A or B segment is a contiguous slice ``tokens[lo:hi]``. Documents without tokens
    are dropped; the first ``own_docs`` documents come from ``docs``, the rest from ``reserve``
    (NotNext sources only, never an A).
    """

    def __init__(self, docs: list[str], encoder: SentenceEncoder, reserve: list[str] = ()):
        sentences: list[str] = []
        per_doc: list[int] = []
        for text in chain(docs, reserve):
            s = split_sentences(text)
            sentences.extend(s)
            per_doc.append(len(s))
        self.tokens, lens = encoder.encode(sentences)
        keep = lens > 0
        n_in = len(per_doc)
        doc_of = np.repeat(np.arange(n_in), per_doc)[keep]
        counts = np.bincount(doc_of, minlength=n_in)
        self.own_docs = int((counts[: len(docs)] > 0).sum())
        counts = counts[counts > 0]
        self.off = np.concatenate([[0], np.cumsum(lens[keep])]).tolist()
        self.doc_n = counts.tolist()
        self.doc_first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64).tolist() if len(counts) else []

    @property
    def num_docs(self) -> int:
        return len(self.doc_n)


def _pairs_for_document(part: _Partition, d: int, cfg: ExamplesConfig, rng: random.Random, out: list):
    """Append ``(a_lo, a_hi, b_lo, b_hi, is_random_next)`` for document ``d`` (Google's loop, l. 223).

    Needs ``part.num_docs >= 2`` (a NotNext B comes from another document). ``rng`` is a
    ``random.Random``: this loop makes a few scalar draws per example, which are ~10x cheaper
    there than with a numpy Generator.
    """
    off, first, n = part.off, part.doc_first[d], part.doc_n[d]
    ndocs = part.num_docs
    max_num_tokens = cfg.max_seq_len - 3
    target = max_num_tokens
    if rng.random() < cfg.short_seq_prob:
        target = rng.randint(2, max_num_tokens)
    chunk_start, length, i = 0, 0, 0
    while i < n:
        length += off[first + i + 1] - off[first + i]
        if i == n - 1 or length >= target:
            k = i - chunk_start + 1  # sentences in the chunk
            a_end = 1 if k < 2 else rng.randint(1, k - 1)
            a_lo, a_hi = off[first + chunk_start], off[first + chunk_start + a_end]
            if k == 1 or rng.random() < 0.5:
                r = rng.randrange(ndocs - 1)
                r += r >= d  # uniform over the other documents
                r_first, r_n = part.doc_first[r], part.doc_n[r]
                start = rng.randrange(r_n)
                target_b = target - (a_hi - a_lo)
                j = start
                while j < r_n:
                    j += 1
                    if off[r_first + j] - off[r_first + start] >= target_b:
                        break
                b_lo, b_hi, random_next = off[r_first + start], off[r_first + j], True
                i -= k - a_end  # put the unused sentences back
            else:
                b_lo, b_hi, random_next = a_hi, off[first + i + 1], False
            out.append((*truncate_pair(a_lo, a_hi, b_lo, b_hi, max_num_tokens, rng), random_next))
            chunk_start, length = i + 1, 0
        i += 1


def _gather_rows(tokens: np.ndarray, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat ``[CLS] A [SEP] B [SEP]`` ids, token_type_ids and row offsets, without a row loop.

    ``pairs`` has columns ``a_lo, a_hi, b_lo, b_hi``. Each row is 5 runs (CLS, A, SEP, B,
    SEP); a run of length ``n`` copies ``ext[src : src + n]`` where ``ext`` is ``tokens``
    followed by the two special ids.
    """
    n = len(pairs)
    ext = np.concatenate([tokens, np.array([CLS_ID, SEP_ID], dtype=tokens.dtype)])
    cls_at, sep_at = len(tokens), len(tokens) + 1
    len_a, len_b = pairs[:, 1] - pairs[:, 0], pairs[:, 3] - pairs[:, 2]
    run_len = np.stack([np.ones(n, np.int64), len_a, np.ones(n, np.int64), len_b, np.ones(n, np.int64)], 1).ravel()
    run_src = np.stack(
        [np.full(n, cls_at), pairs[:, 0], np.full(n, sep_at), pairs[:, 2], np.full(n, sep_at)], 1
    ).ravel()
    run_dst = np.cumsum(run_len) - run_len
    total = int(run_len.sum())
    src = np.repeat(run_src - run_dst, run_len) + np.arange(total)
    ids = ext[src]
    types = np.repeat(np.tile(np.array([0, 1], dtype=np.uint8), n), np.stack([len_a + 2, len_b + 1], 1).ravel())
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(len_a + len_b + 3, out=offsets[1:])
    return ids, types, offsets


def shard_schema(id_dtype, masking: str) -> pa.Schema:
    id_type = pa.from_numpy_dtype(id_dtype)
    cols = [
        pa.field("input_ids", pa.list_(id_type)),
        pa.field("token_type_ids", pa.list_(pa.uint8())),
        pa.field("next_sentence_label", pa.int8()),
    ]
    if masking == "static":
        cols += [pa.field("masked_lm_positions", pa.list_(pa.uint16())), pa.field("masked_lm_ids", pa.list_(id_type))]
    return pa.schema(cols)


class _Worker:
    """Everything one process needs: tokenizer, masking spec, config; turns a partition into shard bytes."""

    def __init__(self, tokenizer_text: str, cfg: ExamplesConfig):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_str(tokenizer_text)
        self.cfg = cfg
        self.spec = _masking_spec(self.tok, cfg)
        self.id_dtype = id_dtype(self.spec.vocab_size)
        self.schema = shard_schema(self.id_dtype, cfg.masking)
        self.encoder = SentenceEncoder(self.tok, self.id_dtype)

    def process(
        self, split: str, partition: int, docs: list[str], dupes: int, reserve: list[str] = ()
    ) -> list[tuple[dict, bytes]]:
        """Tokenize one partition once; return its ``dupes`` shards as ``(stats, parquet bytes)``.

        ``reserve`` (documents of a neighbouring partition) is tokenized only when the partition
        has a single usable document, to give it NotNext partners."""
        part = _Partition(docs, self.encoder)
        if part.num_docs == 1 and reserve:
            part = _Partition(docs, self.encoder, reserve)
        return [self._shard(split, partition, d, part, dupes) for d in range(dupes)]

    def _shard(self, split: str, partition: int, dupe: int, part: _Partition, dupes: int) -> tuple[dict, bytes]:
        cfg = self.cfg
        key = f"bertrace-examples/{cfg.seed}/{split}/{partition}/{dupe}"
        pair_rng = random.Random(key)  # str seeds are hashed with sha512: stable across runs
        np_rng = np.random.default_rng([cfg.seed, SPLIT_IDS[split], partition, dupe])

        pairs: list[tuple] = []
        if part.num_docs >= 2:  # a lone document has no NotNext partner: no pairs (see the module doc)
            for d in range(part.own_docs):
                _pairs_for_document(part, d, cfg, pair_rng, pairs)
        pairs = np.array(pairs, dtype=np.int64).reshape(-1, 5)
        pairs = pairs[np_rng.permutation(len(pairs))]  # shuffle within the shard
        nsp = pairs[:, 4].astype(np.int8)

        ids, types, offsets = _gather_rows(part.tokens, pairs[:, :4])
        masked = 0
        if cfg.masking == "static":
            ids, positions, labels, per_row = mask_rows(ids, offsets, np_rng, self.spec)
            masked = len(positions)

        columns = [
            list_column(ids, offsets, self.id_dtype, offsets=True),
            list_column(types, offsets, np.uint8, offsets=True),
            arrow_array(nsp, pa.int8()),
        ]
        if cfg.masking == "static":
            columns += [
                list_column(positions, per_row, np.uint16, offsets=False),
                list_column(labels, per_row, self.id_dtype, offsets=False),
            ]
        table = pa.Table.from_arrays(columns, schema=self.schema)

        index = partition * dupes + dupe
        sink = pa.BufferOutputStream()
        # Token ids have no useful dictionary or min/max statistics: skipping both writes
        # 25% faster and smaller files.
        pq.write_table(
            table,
            sink,
            compression="zstd",
            row_group_size=cfg.row_group_size,
            use_dictionary=False,
            write_statistics=False,
        )
        data = sink.getvalue().to_pybytes()
        stats = {
            "split": split,
            "index": index,
            "path": f"{split}/shard-{index:05d}.parquet",
            "rows": len(pairs),
            "tokens": int(offsets[-1]),
            "sha256": sha256_bytes(data),
            "random_next": int(nsp.sum()),
            "masked": masked,
        }
        return stats, data


# Per-process worker state, built on a process's first task and reused by the next ones
# (pool processes and Dask workers alike); keyed by what the shards depend on.
_WORKERS: dict[tuple, _Worker] = {}


def _partition_task(shared: tuple, split: str, partition: int, docs: list[str], dupes: int, reserve: list[str] = ()):
    """One task of :func:`generate_examples`: a partition's shards, as ``[(stats, bytes), ...]``."""
    tokenizer_text, tokenizer_sha, cfg, fingerprint, limit_threads = shared
    if limit_threads:  # N worker processes already use the cores; the Rust thread pool would oversubscribe
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    shards.check_worker_code(fingerprint, CODE_MODULES)
    key = (tokenizer_sha, repr(cfg.recipe()))
    if key not in _WORKERS:
        _WORKERS.clear()
        _WORKERS[key] = _Worker(tokenizer_text, cfg)
    return _WORKERS[key].process(split, partition, docs, dupes, reserve)


# the modules whose source decides the MLM / NSP shard bytes (with the library versions)
CODE_MODULES = (
    "pipeline.data.examples",
    "pipeline.data.shards",
    "pipeline.data.encode",
    "pipeline.data.sentences",
    "pipeline.data.masking",
    "pipeline.core.formats",
)


def code_fingerprint() -> str:
    """Hash of the code and library versions that determine the shard bytes (checked on Dask workers)."""
    return shards.code_fingerprint(CODE_MODULES)


# ----------------------------------------------------------------------------- corpus


def _partition_tasks(split: str, partitions: Iterator[list[str]], dupes: int) -> Iterator[tuple]:
    """``(split, p, docs, dupes, reserve)`` per partition; ``reserve`` is the first
    :data:`RESERVE_DOCS` documents of partition ``p - 1`` (of partition 1 for ``p = 0``; none
    when the split has one partition)."""
    first = prev = None
    for p, docs in enumerate(partitions):
        if p == 0:
            first = docs
        else:
            if p == 1:
                yield split, 0, first, dupes, docs[:RESERVE_DOCS]
                first = None
            yield split, p, docs, dupes, prev
        prev = docs[:RESERVE_DOCS]
    if first is not None:  # the split is one partition
        yield split, 0, first, dupes, []


def _check_corpus(path: Path, split: str) -> np.ndarray:
    """The document offsets of a split's corpus (:func:`index_documents`), or an error."""
    if not path.is_file():
        raise BertraceError(f"{path}: {split} corpus not found; run the clean stage first (dvc repro clean)")
    starts = index_documents(path)
    if len(starts) == 0:
        raise BertraceError(f"{path}: the {split} corpus has no documents; check the clean stage's min_chars")
    if len(starts) < 2:
        raise BertraceError(
            f"{path}: the {split} corpus has only 1 document, but NSP needs negatives from a different "
            "document; give the clean stage more text (or a lower min_chars / larger valid_fraction)"
        )
    return starts


# ----------------------------------------------------------------------------- driver


def generate_examples(
    train_txt: str | os.PathLike,
    valid_txt: str | os.PathLike,
    tokenizer_json: str | os.PathLike,
    out_dir: str | os.PathLike,
    cfg: ExamplesConfig,
    *,
    workers: int = 0,
    engine: str | Engine = "local",
    scheduler: str | None = None,
    progress: bool = True,
) -> dict:
    """Write train/valid Parquet shards and ``manifest.json`` (docs/formats.md "Examples shards").

    Partitions are independent tasks, run by ``engine`` (:mod:`pipeline.data.engine`):
    ``local`` uses ``workers`` processes (0 = ``os.cpu_count()``, 1 = this process; never
    more than there are partitions), ``dask`` the cluster at ``scheduler`` (None: a
    LocalCluster of ``workers`` processes). The local pool uses the "spawn" start method, so
    a script calling this with ``workers != 1`` needs an ``if __name__ == "__main__":``
    guard. This process reads the corpus and writes every shard; the output bytes depend on
    neither ``workers`` nor ``engine``. Returns the manifest.
    """
    train_txt, valid_txt, tokenizer_json, out_dir = map(Path, (train_txt, valid_txt, tokenizer_json, out_dir))
    if not isinstance(cfg, ExamplesConfig):
        raise TypeError("cfg must be an ExamplesConfig")
    if not isinstance(engine, Engine):
        engine = Engine.from_params({"engine": engine, "workers": workers, "dask_scheduler": scheduler}, "examples")
    if cfg.mode == "causal":  # packed causal-LM blocks: pipeline/data/packing.py
        return generate_packed(train_txt, valid_txt, tokenizer_json, out_dir, cfg, engine=engine, progress=progress)

    tok = load_tokenizer(tokenizer_json)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    tokenizer_text = tokenizer_json.read_text(encoding="utf-8") if tokenizer_json.is_file() else tok.to_str()
    inputs = {"train.txt": train_txt, "valid.txt": valid_txt}
    starts = {split: _check_corpus(path, split) for split, path in zip(SPLIT_IDS, inputs.values())}
    num_docs = {split: len(v) for split, v in starts.items()}
    dupes = {"train": cfg.dupe_factor, "valid": cfg.valid_dupe_factor}
    sizes = {split: partition_sizes(num_docs[split], cfg.docs_per_shard) for split in SPLIT_IDS}

    # Parallelism is per partition: more processes than partitions would only cost start-up.
    n_tasks = sum(len(v) for v in sizes.values())
    if engine.kind == "local":
        engine = Engine("local", min(engine.local_workers, n_tasks))
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale(out_dir)
    tasks = (
        task
        for split, path in zip(SPLIT_IDS, inputs.values())
        for task in _partition_tasks(
            split,
            read_partitions(
                path,
                starts[split],
                document_order(num_docs[split], cfg.seed, split, cfg.shuffle_documents),
                sizes[split],
            ),
            dupes[split],
        )
    )
    parallel = engine.kind == "dask" or engine.local_workers > 1
    shared = (tokenizer_text, sha256_bytes(tokenizer_text.encode("utf-8")), cfg, code_fingerprint(), parallel)

    results: list[dict] = []
    with tqdm(total=sum(num_docs.values()), unit="doc", desc="examples", disable=not progress) as bar:
        for (_split, _, docs, *_), shards in run_tasks(_partition_task, shared, tasks, engine, what="examples"):
            for stats, data in shards:
                with atomic_path(out_dir / stats["path"]) as tmp:
                    tmp.write_bytes(data)
                results.append(stats)
            bar.update(len(docs))
    _WORKERS.clear()  # the in-process worker (workers: 1) and its chunk cache

    splits = {}
    for split in SPLIT_IDS:
        shards = sorted((r for r in results if r["split"] == split), key=lambda r: r["index"])
        rows = sum(s["rows"] for s in shards)
        tokens = sum(s["tokens"] for s in shards)
        if rows == 0:
            raise BertraceError(
                f"{inputs[split + '.txt']}: produced no {split} examples (its documents tokenize to nothing "
                "usable); check the clean stage's output and the tokenizer"
            )
        entry = {
            "rows": rows,
            "tokens": tokens,
            "documents": num_docs[split],
            "nsp_random_fraction": sum(s["random_next"] for s in shards) / max(rows, 1),
            "shards": [{k: s[k] for k in ("path", "rows", "tokens", "sha256")} for s in shards],
        }
        if cfg.masking == "static":
            entry["masked_fraction"] = sum(s["masked"] for s in shards) / max(tokens, 1)
        splits[split] = entry

    tokenizer_sha = sha256_file(tokenizer_json)
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "mode": "mlm_nsp",
        "masking": cfg.masking,
        "tokenizer_sha256": tokenizer_sha,
        "vocab_size": vocab_size,
        "special_ids": dict(SPECIAL_IDS),
        "max_seq_len": cfg.max_seq_len,
        "masked_lm_prob": cfg.masked_lm_prob,
        "max_predictions_per_seq": cfg.max_predictions_per_seq,
        "whole_word_masking": cfg.whole_word_masking,
        "mask_candidates": cfg.mask_candidates,  # the loader's dynamic masking follows it (absent: skip_special)
        "shuffle_documents": cfg.shuffle_documents,
        "seed": cfg.seed,
        "params": cfg.recipe(),
        "inputs": {
            "train.txt": sha256_file(train_txt),
            "valid.txt": sha256_file(valid_txt),
            "tokenizer.json": tokenizer_sha,
        },
        "splits": splits,
    }
    write_json(out_dir / "manifest.json", manifest)
    return manifest
