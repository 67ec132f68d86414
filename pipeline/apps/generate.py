"""Sampling from a causal-LM checkpoint (``bertrace generate``): prompt in, streamed text out.

* The prompt is encoded without the BERT template and preceded by the separator ``[SEP]``, which
  ends every document in the causal examples: the model continues as at the start of a document
  (GPT-2 conditions on ``<|endoftext|>`` the same way). Generation stops after a separator, after
  ``max_new_tokens``, or at the model's ``max_position``.
* Each step feeds only the new token and reuses every layer's keys and values (the KV cache of
  :class:`pipeline.models.gpt.GPT`), so a token costs one position, not the whole prefix.
* Next-token choice (:func:`sample_next`): temperature 0 is greedy (argmax, as ``transformers``'
  ``generate(do_sample=False)``); otherwise logits / temperature, then top-k (Fan et al. 2018)
  and nucleus / top-p (Holtzman et al. 2020) filtering, then one draw from a ``torch.Generator``
  seeded by ``seed``: the same seed gives the same text.
* :class:`TextStream` turns token ids into text pieces as they come. WordPiece decoding joins a
  ``##`` piece to the word before it and "cleans up" spaces before punctuation (``don ' t`` ->
  ``don't``), so the text of the newest token is not final until the next one is known: a piece
  is written once two consecutive decodings agree on it, and the rest at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from pipeline.core.errors import BertraceError
from pipeline.core.formats import SEP_ID
from pipeline.data.tokenizer import encode_prompt

# --------------------------------------------------------------------------------------------
# Loading


def load_causal_lm(checkpoint: str | Path, tokenizer_path: str | Path | None = None):
    """``(GPT in eval mode, tokenizers.Tokenizer, checkpoint dict without the weights)``.

    A fine-tuned or masked-LM checkpoint is a clear error; so is a tokenizer whose sha256 is not
    the one the checkpoint records."""
    from pipeline.models.checkpoint import read_checkpoint
    from pipeline.models.gpt import causal_lm_from_checkpoint

    return causal_lm_from_checkpoint(read_checkpoint(checkpoint), Path(checkpoint), tokenizer_path)


# --------------------------------------------------------------------------------------------
# Sampling


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> int:
    """One next-token id from 1-D ``logits``: greedy at temperature 0, else a draw from the
    tempered, top-k / top-p filtered distribution."""
    if temperature == 0:
        return int(logits.argmax())
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it does
        drop = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
    if max_new_tokens < 0:
        raise BertraceError(f"--max-new-tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise BertraceError(f"--temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 0:
        raise BertraceError(f"--top-k must be >= 0 (0 = off), got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise BertraceError(f"--top-p must be in (0, 1] (1 = off), got {top_p}")


@torch.no_grad()
def generate(
    model,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_ids: Sequence[int] = (SEP_ID,),
    on_token: Callable[[int], None] | None = None,
) -> list[int]:
    """The new token ids after ``prompt_ids`` (a stop id, if drawn, is the last one), each passed
    to ``on_token`` as soon as it is chosen. One forward of the prompt, then one position a step."""
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    limit = model.config.max_position
    if not prompt_ids:
        raise BertraceError("generate: the prompt has no tokens; start it with the separator (encode_prompt)")
    if len(prompt_ids) >= limit:
        raise BertraceError(
            f"generate: the prompt has {len(prompt_ids)} tokens, the model's max_position is {limit}; "
            "shorten the prompt"
        )
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(0 if seed is None else seed)
    out = model(torch.tensor([list(prompt_ids)], device=device), use_cache=True)
    new: list[int] = []
    budget = min(max_new_tokens, limit - len(prompt_ids))  # stop at max_position
    while len(new) < budget:
        token = sample_next(out.logits[0, -1], temperature, top_k, top_p, generator)
        new.append(token)
        if on_token is not None:
            on_token(token)
        if token in stop_ids or len(new) == budget:
            break
        out = model(torch.tensor([[token]], device=device), past_key_values=out.past_key_values, use_cache=True)
    return new


# --------------------------------------------------------------------------------------------
# Streaming text


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class TextStream:
    """Incremental WordPiece decoding: ``push(id)`` returns the text that became final (maybe
    ""), ``finish()`` the rest; joined, they are ``tokenizer.decode(prompt + new)``."""

    tokenizer: Any
    ids: list[int] = field(default_factory=list)
    shown: str = ""  # the text returned so far
    previous: str = ""  # the decoding before the last token

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        # what two consecutive decodings agree on is final; the newest token's text may still change
        stable = text[: _common_prefix(self.previous, text)]
        self.previous = text
        if len(stable) > len(self.shown) and stable.startswith(self.shown):
            piece, self.shown = stable[len(self.shown) :], stable
            return piece
        return ""

    def finish(self) -> str:
        text = self.tokenizer.decode(self.ids)
        piece = text[len(self.shown) :] if text.startswith(self.shown) else ""
        self.shown = text
        return piece


@dataclass
class Sample:
    prompt_ids: list[int]
    new_ids: list[int]
    text: str  # the decoding of prompt + continuation (normalised as the tokenizer normalises)
    continuation: str  # the decoding of the new tokens alone


def generate_text(
    model,
    tokenizer,
    prompt: str,
    max_new_tokens: int = 50,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    on_text: Callable[[str], None] | None = None,
) -> Sample:
    """Encode ``prompt``, sample a continuation, and stream the decoded text (prompt first) to
    ``on_text`` piece by piece."""
    prompt_ids = encode_prompt(tokenizer, prompt)
    stream = TextStream(tokenizer)
    emit = on_text or (lambda s: None)
    for t in prompt_ids:
        piece = stream.push(t)
        if piece:
            emit(piece)

    def on_token(token: int) -> None:
        piece = stream.push(token)
        if piece:
            emit(piece)

    new = generate(
        model,
        prompt_ids,
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        on_token=on_token,
    )
    rest = stream.finish()
    if rest:
        emit(rest)
    return Sample(prompt_ids, new, stream.shown, tokenizer.decode(new))
