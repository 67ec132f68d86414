"""A GPT-2 style decoder (Radford et al. 2019), in the spirit of nanoGPT's model.py.

The network is OpenAI's GPT-2 (``model.py`` of openai/gpt-2; Hugging Face ``GPT2LMHeadModel``):

- embeddings: token + learned absolute position, summed, then dropout (no LayerNorm, no segments);
- pre-LN blocks: ``x = x + drop(attn(LN(x)))``, ``x = x + drop(mlp(LN(x)))`` (GPT-2 section 2.3
  moved the LayerNorm to each block's input), causal self-attention;
- a final LayerNorm after the last block, and the LM head tied to the token embedding (one
  Parameter, no bias);
- init N(0, 0.02), with the residual projections (attention output, MLP output) scaled by
  1/sqrt(2 * layers) ("we scale the weights of residual layers at initialization by 1/sqrt(N)",
  GPT-2 section 2.3; N = 2 residual additions per block, as nanoGPT and HF's ``c_proj``).

It reuses the encoder's :class:`~pipeline.models.bert.BertConfig` (``type_vocab_size`` is unused),
its ``gelu``, ``FeedForward`` (the same fc -> GELU -> proj MLP) and ``init_weights``.
Parameter names differ from Hugging Face's; ``pipeline/interop/hf_gpt.py`` maps between the two and
tests/unit/models/test_gpt.py checks logits against ``transformers`` to 1e-5.

Padding: batches are right-padded, so every real token precedes every padding token in its row
and the causal mask alone keeps padding out of every real position's attention; the attention
always runs without an explicit mask (``is_causal=True``, so the fused kernels apply) and the
outputs at padded positions are simply never read. Positions start at 0 in every row.

Sampling uses a key/value cache (``use_cache=True``): each layer returns its keys and values,
and a later call attends over the cache plus its new tokens, so each new token costs one
position (:mod:`pipeline.apps.generate`). :func:`causal_lm_from_checkpoint` builds the model of a
``clm`` pre-training checkpoint.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from pipeline.core.errors import BertraceError
from pipeline.models.bert import BertConfig, FeedForward
from pipeline.models.primitives import Dropout, init_weights, linear_cross_entropy, load_strict, strip_wrappers

KVCache = tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer (keys, values), each [B, heads, P, head_dim]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, q/k/v fused into one (H, 3H) matmul, with an optional
    key/value cache of the positions before ``x``. ``rows`` (flat indices into B*T): apply the
    output projection only there and return [R, H] (keys and values still come from every position)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_dropout = config.attention_dropout

    def forward(
        self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None, rows: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        B, T, H = x.shape
        q, k, v = self.qkv(x).split(H, dim=2)
        q, k, v = (t.view(B, T, self.num_heads, H // self.num_heads).transpose(1, 2) for t in (q, k, v))
        dropout = self.attention_dropout if self.training else 0.0
        if past is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        else:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            P = k.size(2) - T
            # query i (absolute position P + i) sees keys 0..P + i. SDPA's is_causal aligns the
            # mask top-left (query i sees keys 0..i), which is right only without a cache; one new
            # token sees everything, so it needs no mask at all.
            mask = None if T == 1 else torch.ones(T, P + T, dtype=torch.bool, device=x.device).tril(diagonal=P)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        y = y.transpose(1, 2).reshape(B, T, H)
        if rows is not None:
            y = y.reshape(B * T, H).index_select(0, rows)
        return self.proj(y), (k, v)


class Block(nn.Module):
    """Pre-LN Transformer block (GPT-2 section 2.3). With ``rows`` everything after the attention
    is position-wise, so it runs only at those rows: [B, T, H] in, [R, H] out."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = FeedForward(config)
        self.drop = Dropout(config.dropout)

    def forward(
        self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None, rows: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        attn, kv = self.attn(self.ln_1(x), past, rows)
        if rows is not None:
            x = x.reshape(-1, x.size(-1)).index_select(0, rows)
        x = x + self.drop(attn)
        x = x + self.drop(self.mlp(self.ln_2(x)))
        return x, kv


class GPTOutput(NamedTuple):
    logits: torch.Tensor | None  # [B, T, V'] (V' = tokenizer vocabulary), or [R, V'] at ``rows``; None with targets
    hidden: torch.Tensor  # [B, T, H] after the final LayerNorm, or [R, H] at ``rows``
    past_key_values: KVCache | None  # with use_cache: every layer's keys and values so far
    loss: torch.Tensor | None = None  # with targets: the mean next-token cross entropy


class GPT(nn.Module):
    """The decoder with its tied LM head: ``forward -> GPTOutput(logits, hidden, past_key_values)``."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position, config.hidden_size)
        self.drop = Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.num_layers)])
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying (Press & Wolf 2017; GPT-2): one Parameter
        self.apply(lambda m: init_weights(m, config.initializer_range))
        # GPT-2 2.3: residual projections scaled by 1/sqrt(N), N = 2 residual additions per block
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.proj.weight")):
                nn.init.normal_(p, mean=0.0, std=config.initializer_range / math.sqrt(2 * config.num_layers))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        positions: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
    ) -> GPTOutput:
        """``input_ids`` [B, T] follow the ``past_key_values`` positions when given.

        ``attention_mask`` [B, T] (1 = token, 0 = padding) is accepted for the callers' symmetry
        with the encoder but not needed: batches are right-padded, so causality alone keeps the
        padding out of every real token's attention (see the module docstring). ``positions``:
        position ids [T] or [B, T] (default ``past_len + arange(T)``). ``rows``: 1-D flat indices
        into B*T (``b * T + t``); the last block's position-wise part (attention output, MLP), the
        final LayerNorm and the LM head then run at those rows only, and ``logits`` / ``hidden``
        are [R, ...] (fine-tuning reads one row per example). Exact: the keys and values of the
        last block still come from every position. ``targets``: the token each output row predicts
        (-100: none); ``loss`` is then their mean cross entropy and, while autograd records, the
        logits are never materialised (:func:`linear_cross_entropy`; ``logits`` is None).
        """
        B, T = input_ids.shape
        past_len = past_key_values[0][0].size(2) if past_key_values is not None else 0
        if past_len + T > self.config.max_position:
            raise BertraceError(
                f"model: sequence length {past_len + T} exceeds max_position {self.config.max_position}; "
                f"shorten the examples (examples.max_seq_len) or raise model.max_position"
            )
        if rows is not None and rows.dim() != 1:
            raise BertraceError(
                f"model: rows must be 1-D flat indices into B*T, got shape {tuple(rows.shape)}; use b * T + t"
            )
        if positions is None:
            pos = self.wpe.weight[past_len : past_len + T]  # [T, H]
        else:
            pos = self.wpe(positions)
        x = self.drop(self.wte(input_ids) + pos)
        cache = []
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            # only the rows read downstream go through the last block's position-wise part
            x, kv = block(x, past_key_values[i] if past_key_values is not None else None, rows if i == last else None)
            if use_cache:
                cache.append(kv)
        hidden = self.ln_f(x)
        # a padded vocabulary's extra ids are never predicted: the head stops at the tokenizer's
        # (a slice of the weight, not of the logits, which would make them non-contiguous)
        head = self.lm_head.weight[: self.config.predicted_vocab_size]
        cache = tuple(cache) if use_cache else None
        if targets is not None and torch.is_grad_enabled():
            loss = linear_cross_entropy(hidden.reshape(-1, hidden.size(-1)), head, targets.reshape(-1), chunk=256)
            return GPTOutput(None, hidden, cache, loss)
        logits = F.linear(hidden, head)
        loss = (
            None
            if targets is None
            else F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))
        )
        return GPTOutput(logits, hidden, cache, loss)


def causal_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean next-token cross entropy: the logits at position t predict ``input_ids[:, t + 1]``.

    Targets equal to ``ignore_index`` do not count (pass labels with -100 at padding). The
    targets are shifted, not the logits: the last position gets ``ignore_index``, so the
    [B, T, V] logits are read in place (slicing them would copy the largest tensor of a step).
    """
    targets = F.pad(input_ids[:, 1:].long(), (0, 1), value=ignore_index)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=ignore_index)


def last_token_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Flat indices (``b * T + t``) of each row's last real token in a right-padded batch."""
    B, T = input_ids.shape
    if attention_mask is None:
        last = torch.full((B,), T - 1, dtype=torch.long, device=input_ids.device)
    else:
        last = attention_mask.long().sum(1).clamp(min=1) - 1
    return torch.arange(B, device=input_ids.device) * T + last


class GPTForSequenceClassification(nn.Module):
    """GPT -> the last real token's final hidden state -> dropout -> Linear without bias, as
    Hugging Face's ``GPT2ForSequenceClassification`` (``score``): in a causal model only the last
    token has seen the whole text. ``forward -> logits [B, num_labels]``."""

    def __init__(self, config: BertConfig, num_labels: int, classifier_dropout: float | None = None):
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.gpt = GPT(config)
        self.drop = Dropout(config.dropout if classifier_dropout is None else classifier_dropout)
        self.score = nn.Linear(config.hidden_size, num_labels, bias=False)
        init_weights(self.score, config.initializer_range)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``token_type_ids`` are accepted for symmetry with the encoder and ignored (GPT-2 has
        no segment embedding)."""
        hidden = self.gpt(input_ids, attention_mask, rows=last_token_rows(input_ids, attention_mask)).hidden
        return self.score(self.drop(hidden))

    def load_pretrained_decoder(self, pretraining_state_dict: dict, source: str = "checkpoint") -> None:
        """Load the decoder from a :class:`GPT` state dict (the ``clm`` objective's ``model``),
        strictly; ``score`` keeps its fresh init. torch.compile / DDP prefixes are stripped."""
        sd = {strip_wrappers(k): v for k, v in pretraining_state_dict.items()}
        if "wte.weight" not in sd:
            bert = any(k.startswith("bert.") for k in sd)
            raise BertraceError(
                f"{source}: no 'wte.weight' in the weights; not a causal LM (GPT) state dict"
                + ("; it is a BERT (masked LM) checkpoint: pre-train with pretrain.objective: clm" if bert else "")
            )
        load_strict(self.gpt, sd, source)


def causal_lm_from_checkpoint(ckpt: dict, path: Path, tokenizer_path: str | Path | None = None):
    """``(GPT in eval mode, tokenizers.Tokenizer, checkpoint dict without the weights)`` from a
    pre-training checkpoint dict read from ``path``. A fine-tuned or masked-LM checkpoint is a clear
    error; so is a tokenizer whose sha256 is not the one the checkpoint records."""
    from tokenizers import Tokenizer

    from pipeline.data.tokenizer import find_tokenizer
    from pipeline.models.checkpoint import (
        check_tokenizer_hash,
        checkpoint_objective,
        is_causal_state_dict,
        is_finetuned,
        load_weights,
    )

    if is_finetuned(ckpt):
        raise BertraceError(
            f"{path}: a fine-tuned classifier, not a language model; generate from a pre-training "
            "checkpoint of pretrain.objective: clm (data/pretrain/best.pt)"
        )
    if not is_causal_state_dict(ckpt["model"]):
        raise BertraceError(
            f"{path}: an encoder (masked-LM) checkpoint (pretrain.objective: {checkpoint_objective(ckpt)}), "
            "which cannot generate text; set pretrain.objective: clm in params.yaml (or use the gpt profile) and "
            "rerun the pretrain stage"
        )
    tok_path = find_tokenizer(path, tokenizer_path)
    expected = ckpt.get("tokenizer_sha256") or (ckpt.get("provenance") or {}).get("tokenizer_sha256")
    check_tokenizer_hash(tok_path, expected, path)
    tokenizer = Tokenizer.from_file(str(tok_path))
    config = BertConfig.from_dict(ckpt["model_config"])
    if tokenizer.get_vocab_size() > config.vocab_size:
        raise BertraceError(
            f"{tok_path}: vocabulary of {tokenizer.get_vocab_size()} tokens is larger than the "
            f"model's {config.vocab_size}; use the checkpoint's own tokenizer"
        )
    model = GPT(config)
    load_weights(model, ckpt["model"], path)
    return model.eval(), tokenizer, {k: v for k, v in ckpt.items() if k != "model"}


def decoder_flops_per_token(config: BertConfig, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token of :class:`GPT` on ``seq_len`` blocks, for MFU.

    As ``pipeline.models.bert.decoder_flops_per_token``: 6 FLOPs per weight per token for the matmuls
    (Kaplan et al. 2020) and 12 * L * H * T for attention (PaLM appendix B, which counts the full
    T x T scores, as a masked, non-fused attention computes them):

        6 * L * (4H^2 + 2HI)    q/k/v, attention output, FFN in and out
      + 6 * H * V               LM head at every position
      + 12 * L * H * T          attention scores and weighted sum

    Embedding lookups, biases, LayerNorm, softmax and GELU are left out (not matmuls).
    """
    L, H, I, T = config.num_layers, config.hidden_size, config.intermediate_size, seq_len
    V = config.vocab_size
    return float(6 * L * (4 * H * H + 2 * H * I) + 6 * H * V + 12 * L * H * T)
