"""Skip-gram word vectors from the pre-training examples, to initialise the token embedding.

The tiny model keeps most of its parameters in the token embedding (2.0 M of 2.6 M at 2/128 with
16k WordPiece ids), and masked-LM pre-training updates a row only when its token is predicted or
seen as context: on a CPU budget most rows barely move from N(0, 0.02). Word2vec's skip-gram with
negative sampling (Mikolov et al. 2013, "Distributed Representations of Words and Phrases")
learns a vector for every id from every co-occurrence, at a fraction of a transformer step's cost
per token. The vectors are trained here, from the pipeline's own examples and tokenizer (no
external vectors), and standardised to the initialiser's scale before they replace the random
rows (Kim, Balasubramanian & Kang 2024 on standardising static vectors for transformers; Kim
2014 for random vs word2vec initialisation on SST-2).

Recipe, as word2vec.c: pairs (centre, context) within a window whose size is drawn per centre
uniformly from 1..window (implemented as keeping a pair at distance d with probability
(window - d + 1) / window), frequent ids subsampled with threshold ``subsample``, ``negatives``
noise ids per pair from the unigram distribution raised to 3/4, logistic loss. Pairs never cross a
[CLS]/[SEP] boundary (segments A and B can come from different documents). Optimised with Adam
(the embedding tables are small; batches of whole example rows), lr decayed linearly to 0
(pipeline/pretrain/schedule.py, no warmup).

Everything is seeded and runs in a fixed order, so the vectors are the same bytes for the same
examples, params, torch version and thread count (as the rest of pre-training).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Iterator, Literal

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from pydantic import Field

from pipeline.core.config import Float, Int, Section
from pipeline.core.errors import BertraceError
from pipeline.pretrain.schedule import lr_at_progress


class EmbeddingInit(Section):
    """``pretrain.embedding_init``: how the token embedding starts (``random`` = BERT's N(0, 0.02))."""

    SECTION = "pretrain.embedding_init"

    method: Literal["random", "skipgram"] = "skipgram"
    window: Annotated[Int, Field(ge=1)] = 5  # largest distance between centre and context (word2vec -window)
    negatives: Annotated[Int, Field(ge=1)] = 5  # noise ids per pair (word2vec -negative)
    subsample: Annotated[Float, Field(ge=0)] = 1e-4  # frequent-id subsampling threshold (word2vec -sample); 0 = off
    epochs: Annotated[Float, Field(gt=0)] = 1.0  # passes over the training examples (examples.dupe_factor copies)
    lr: Annotated[Float, Field(gt=0)] = 1e-2  # Adam peak, decayed linearly to 0
    shared_negatives: Annotated[Int, Field(ge=1)] = 64  # noise ids drawn per example row, scored by all its centres
    batch_rows: Annotated[Int, Field(ge=1)] = 256  # example rows per update
    seed: Annotated[Int, Field(ge=0)] = 0


def training_rows(examples_dir: str | Path, manifest: dict) -> Iterator[np.ndarray]:
    """The train split's rows as the tokenizer wrote them (static masks undone: ``masked_lm_ids``
    put back at ``masked_lm_positions``), shard by shard in the manifest's order."""
    for flat, offsets in _train_shards(examples_dir, manifest):
        for i in range(len(offsets) - 1):
            yield flat[offsets[i] : offsets[i + 1]]


def _train_shards(examples_dir: str | Path, manifest: dict) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each train shard's rows as (ids int64, row offsets), masks undone, in the manifest's order."""
    for shard in manifest["splits"]["train"]["shards"]:
        path = Path(examples_dir) / shard["path"]
        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a damaged file
            raise BertraceError(f"{path}: cannot read this example shard ({e}); rerun the examples stage") from None
        flat, offsets = _flat(table.column("input_ids"))
        if "masked_lm_positions" in table.column_names:  # static masking: put the originals back
            positions, pos_offsets = _flat(table.column("masked_lm_positions"))
            labels, _ = _flat(table.column("masked_lm_ids"))
            row_of = np.repeat(np.arange(len(offsets) - 1), np.diff(pos_offsets))
            flat[offsets[row_of] + positions] = labels
        yield flat, offsets


def _flat(column) -> tuple[np.ndarray, np.ndarray]:
    """A list<int> Arrow column as (values int64, offsets): no Python list per row."""
    arr = column.combine_chunks()
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy().astype(np.int64)
    return values[offsets[0] : offsets[-1]].copy(), offsets - offsets[0]


def _batches(rows: Iterator[np.ndarray], batch_rows: int, boundary_ids: list[int]) -> Iterator[torch.Tensor]:
    """[B, T] id tensors, -1 at padding and at the boundary ids ([CLS], [SEP], [PAD])."""
    buf: list[np.ndarray] = []
    for row in rows:
        buf.append(row)
        if len(buf) == batch_rows:
            yield _pad(buf, boundary_ids)
            buf = []
    if buf:
        yield _pad(buf, boundary_ids)


def _pad(rows: list[np.ndarray], boundary_ids: list[int]) -> torch.Tensor:
    out = np.full((len(rows), max(len(r) for r in rows)), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    out[np.isin(out, boundary_ids)] = -1
    return torch.from_numpy(out)


def skipgram_loss(
    ids: torch.Tensor,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    keep_token: torch.Tensor,
    *,
    window: int,
    negatives: int,
    noise: torch.Tensor,
    shared_negatives: int,
    g: torch.Generator,
) -> tuple[torch.Tensor, int]:
    """Summed negative-sampling loss of one [B, T] batch (-1 = boundary or padding) and its pair count.

    Pairs are scored with one [T, T] matmul per row (no per-pair gather), weighted by the window. Each row draws
    ``shared_negatives`` noise ids that all its centres score against; the mean over them times
    ``negatives``, weighted by the centre's number of pairs, is an unbiased estimate of word2vec's
    sum over ``negatives`` noise ids per pair, at a small fraction of the memory traffic."""
    boundary = ids < 0
    segment = boundary.cumsum(1)  # positions with the same count of boundaries before them share a segment
    kept = ~boundary & (torch.rand(ids.shape, generator=g) < keep_token[ids.clamp(min=0)])
    safe = ids.clamp(min=0)
    v_in, v_out = F.embedding(safe, w_in), F.embedding(safe, w_out)  # [B, T, D]
    T = ids.size(1)
    dist = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs()  # [T, T]
    # word2vec draws each centre's window from 1..window: a pair at distance d survives with
    # probability (window - d + 1) / window (0 beyond the window and on the diagonal)
    keep_p = ((window + 1 - dist) / window).clamp(0, 1) * (dist > 0)
    ok = kept[:, :, None] & kept[:, None, :] & (segment[:, :, None] == segment[:, None, :])
    weight = (ok & (torch.rand(ok.shape, generator=g) < keep_p)).float()  # [B, centre, context]
    scores = torch.bmm(v_in, v_out.transpose(1, 2))  # every pair of the row; the band is what counts
    loss = -(F.logsigmoid(scores) * weight).sum()
    pairs = weight.sum(-1)  # pairs each position is the centre of
    neg = torch.multinomial(noise, ids.size(0) * shared_negatives, replacement=True, generator=g)
    neg_vecs = F.embedding(neg.view(ids.size(0), shared_negatives), w_out)  # [B, S, D]
    scores = torch.bmm(v_in, neg_vecs.transpose(1, 2))  # [B, T, S]
    loss = loss - negatives * (F.logsigmoid(-scores).mean(-1) * pairs).sum()
    return loss, int(pairs.sum())


def skipgram_vectors(
    examples_dir: str | Path, manifest: dict, dim: int, cfg: EmbeddingInit, *, progress: bool = False
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Train skip-gram vectors on the examples' train split. Returns (vectors [V, dim] float32,
    counts [V] int64, a record for the provenance: pairs, tokens, loss, updates; no times, so the
    record is a function of the examples and ``cfg``)."""
    vocab_size = int(manifest["vocab_size"])
    special = manifest.get("special_ids") or {}
    boundary_ids = [int(special[k]) for k in ("[CLS]", "[SEP]", "[PAD]") if k in special]
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    n_rows = 0
    for flat, offsets in _train_shards(examples_dir, manifest):  # one count per shard, not per row
        counts += torch.from_numpy(np.bincount(flat, minlength=vocab_size)[:vocab_size])
        n_rows += len(offsets) - 1
    counts[boundary_ids] = 0
    total = int(counts.sum())
    if total == 0:
        raise BertraceError(
            f"{examples_dir}: the train examples hold no tokens; pretrain.embedding_init: skipgram "
            "needs a corpus (check the clean and examples stages)"
        )
    freq = counts.double() / total
    t = cfg.subsample
    keep_token = (
        (torch.ones(vocab_size, dtype=torch.float64) if t == 0 else ((freq / t).sqrt() + 1) * t / freq.clamp(min=1e-30))
        .clamp(max=1.0)
        .float()
    )
    noise = counts.double() ** 0.75
    noise = (noise / noise.sum()).float()

    g = torch.Generator().manual_seed(cfg.seed)
    w_in = torch.nn.Parameter((torch.rand(vocab_size, dim, generator=g) - 0.5) / dim)  # word2vec.c's init
    w_out = torch.nn.Parameter(torch.zeros(vocab_size, dim))
    opt = torch.optim.Adam([w_in, w_out], lr=cfg.lr)
    batches_per_epoch = -(-n_rows // cfg.batch_rows)
    total_steps = max(1, int(round(batches_per_epoch * cfg.epochs)))
    step, n_pairs, loss_sum = 0, 0, 0.0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total_steps, desc="skip-gram vectors", unit="batch")
    while step < total_steps:
        for ids in _batches(training_rows(examples_dir, manifest), cfg.batch_rows, boundary_ids):
            if step >= total_steps:
                break
            loss, n = skipgram_loss(
                ids,
                w_in,
                w_out,
                keep_token,
                window=cfg.window,
                negatives=cfg.negatives,
                noise=noise,
                shared_negatives=cfg.shared_negatives,
                g=g,
            )
            if n:
                for group in opt.param_groups:
                    group["lr"] = lr_at_progress(step / total_steps, peak=cfg.lr, warmup_fraction=0.0)
                opt.zero_grad(set_to_none=True)
                (loss / n).backward()
                opt.step()
                n_pairs += n
                loss_sum += float(loss.detach())
            step += 1
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    record = {
        "method": "skipgram",
        "pairs": n_pairs,
        "tokens": total,
        "ids_seen": int((counts > 0).sum()),
        "loss": round(loss_sum / max(n_pairs, 1), 4),
        "updates": total_steps,
    }
    return w_in.detach().clone(), counts, record


def standardise(vectors: torch.Tensor, seen: torch.Tensor, std: float) -> torch.Tensor:
    """Centre the seen ids' vectors and scale them to the initialiser's ``std`` overall (so the
    embedding's scale, and LayerNorm's input, are BERT's at step 0); unseen rows are returned as 0
    (the caller keeps their random init)."""
    out = torch.zeros_like(vectors)
    v = vectors[seen]
    v = v - v.mean(0, keepdim=True)
    out[seen] = v * (std / v.std().clamp(min=1e-12))
    return out


def nearest(vectors: torch.Tensor, query: int, k: int = 8) -> list[int]:
    """The ``k`` ids with the highest cosine similarity to ``query`` (itself excluded): a sanity check."""
    unit = F.normalize(vectors, dim=-1)
    sims = unit @ unit[query]
    sims[query] = -2
    return sims.topk(k).indices.tolist()


def input_embedding(model: torch.nn.Module) -> torch.nn.Embedding:
    """The token embedding table of a pre-training model (BERT / ELECTRA: ``bert.embeddings.word``,
    shared with ELECTRA's generator; GPT: ``wte``)."""
    for path in ("bert.embeddings.word", "wte", "gpt.wte"):
        obj: object = model
        for name in path.split("."):
            obj = getattr(obj, name, None)
        if isinstance(obj, torch.nn.Embedding):
            return obj
    raise BertraceError(f"{type(model).__name__}: no token embedding found for pretrain.embedding_init")


def initialise_embedding(
    model: torch.nn.Module,
    examples_dir: str | Path,
    manifest: dict,
    cfg: EmbeddingInit,
    *,
    std: float,
    progress: bool = False,
) -> dict:
    """Train skip-gram vectors (:func:`skipgram_vectors`) and copy them, standardised to ``std``,
    into the model's token embedding for every id the examples hold; the other rows keep their
    random init. Returns the provenance record."""
    emb = input_embedding(model)
    vectors, counts, record = skipgram_vectors(examples_dir, manifest, emb.embedding_dim, cfg, progress=progress)
    seen = torch.zeros(emb.num_embeddings, dtype=torch.bool)
    seen[: counts.numel()] = counts > 0
    rows = torch.zeros(emb.num_embeddings, emb.embedding_dim)
    rows[: vectors.size(0)] = vectors
    with torch.no_grad():
        scaled = standardise(rows, seen, std)
        emb.weight[seen] = scaled[seen].to(emb.weight.dtype)
    return {**record, "std": std, "params": cfg.to_dict()}
