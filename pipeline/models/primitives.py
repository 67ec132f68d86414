"""Building blocks of the models that need no model config: GELU, the CPU's cheaper dropout,
attention written out, the padding mask for SDPA, the init, the fused linear cross entropy and
strict state-dict loading. :mod:`pipeline.models.bert` builds BERT from them; ELECTRA
(:mod:`pipeline.models.electra`) and the decoder (:mod:`pipeline.models.gpt`) reuse them."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from pipeline.core.errors import BertraceError


def gelu(x: torch.Tensor, kind: str) -> torch.Tensor:
    """Google's modeling.py uses the tanh approximation (Hendrycks & Gimpel 2016, eq. 2)."""
    return F.gelu(x, approximate="tanh" if kind == "tanh" else "none")


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout (Srivastava et al. 2014), as ``F.dropout``. On the CPU the mask comes from
    16 random bits per element, two elements per 32-bit draw (a drop where the bits fall below
    ``p * 65536``, so ``p`` is rounded to a multiple of 2^-16): 3x faster than ``F.dropout``'s one
    Bernoulli draw per element, which took a third of a 2/128 training step (docs/results.md).
    Elsewhere ``F.dropout`` (fused on a GPU). Both draw from torch's global generator."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, True)
    cut = round(p * 65536)
    words = torch.empty((x.numel() + 1) // 2, dtype=torch.int32).random_(-(2**31), 2**31)
    keep = words.view(torch.int16)[: x.numel()].view(x.shape) >= cut - 32768
    return torch.where(keep, x * (65536 / (65536 - cut)), 0.0)


class Dropout(nn.Module):
    """``nn.Dropout`` through :func:`dropout` (the CPU's cheaper mask)."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def attention_written_out(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d)) V in three ops, the softmax in fp32 (as SDPA's math path).

    What SelfAttention trains with on the CPU: there SDPA's fused kernel has a slow backward at
    these sizes (T = 128, a few heads), and the written-out form makes a training step ~10 %
    faster (docs/results.md); GPUs and inference keep the fused kernels."""
    scores = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    if dropout_p:
        p = dropout(p, dropout_p)
    return p @ v


def init_weights(module: nn.Module, std: float) -> None:
    """N(0, std) for Linear and Embedding weights, zero biases, LayerNorm (1, 0).

    As Hugging Face ``_init_weights``; Google's ``create_initializer`` draws from a normal
    truncated at 2 std instead, a difference that does not matter in practice. Like Google (and
    unlike HF's ``padding_idx``) the [PAD] embedding row is an ordinary, trained row.
    """
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def padding_mask(attention_mask: torch.Tensor | None, padded: bool | None = None) -> torch.Tensor | None:
    """[B, T] 1/0 (or bool) mask -> bool [B, 1, 1, T] for SDPA, or None when nothing is padded.

    With ``attn_mask=None`` SDPA may pick its fused flash / memory-efficient kernels. ``padded``
    is the caller's host-side knowledge: False drops the mask, True keeps it unchecked. When it
    is None the mask is checked for all-ones, which reads one value back from the device (a
    GPU→CPU sync); under torch.compile the check is skipped and the mask kept.
    """
    if attention_mask is None or padded is False:
        return None
    mask = attention_mask.bool()
    if padded is None and not torch.compiler.is_compiling() and bool(mask.all()):
        return None
    return mask[:, None, None, :]


class _LinearCrossEntropy(torch.autograd.Function):
    """``F.cross_entropy(hidden @ weight.T + bias, targets)`` (mean over targets != -100) a chunk of
    rows at a time, each chunk's gradients computed as soon as its loss is (Liger Kernel's fused
    linear cross entropy, Hsu et al. 2024): the [N, V] logits, their log-softmax and its gradient
    never exist at full size, only [chunk, V], and each chunk's softmax costs one exp per logit,
    written in place. The vocabulary projection is most of a small model's step (docs/results.md)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk: int):
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        valid = targets != -100
        n = valid.sum().clamp(min=1)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty(hidden.shape, dtype=dtype, device=hidden.device)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=hidden.device)
        grad_bias = None if bias is None else torch.zeros(bias.shape, dtype=torch.float32, device=hidden.device)
        with torch.autocast(device, enabled=False):
            w = weight.to(dtype)
            for start in range(0, hidden.size(0), chunk):
                h = hidden[start : start + chunk].to(dtype)
                t, keep = targets[start : start + chunk].clamp(min=0), valid[start : start + chunk]
                z = (h @ w.t()).float() if bias is None else torch.addmm(bias.to(dtype), h, w.t()).float()  # [chunk, V]
                target_logit = z.gather(1, t[:, None]).squeeze(1)
                top = z.amax(1)
                z.sub_(top[:, None]).exp_()  # exp(z - max): the softmax numerators
                sums = z.sum(1)
                total += ((top + sums.log() - target_logit) * keep).sum()
                scale = keep / n  # d mean loss / d logits = (softmax - onehot) * scale
                z.mul_((scale / sums)[:, None])
                z[torch.arange(t.numel(), device=t.device), t] -= scale
                grad = z.to(dtype)
                grad_hidden[start : start + chunk] = grad @ w
                grad_weight += (grad.t() @ h).float()
                if grad_bias is not None:
                    grad_bias += z.sum(0)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total / n

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        dh, dw, db = ctx.dtypes
        return (
            (grad_hidden * grad_loss).to(dh),
            (grad_weight * grad_loss).to(dw),
            None if grad_bias is None else (grad_bias * grad_loss).to(db),
            None,
            None,
        )


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    chunk: int = 160,
) -> torch.Tensor:
    """Mean cross entropy of ``hidden`` [N, H] @ ``weight`` [V, H].T (+ ``bias`` [V]) against
    ``targets`` [N] (-100: ignored), without the [N, V] logits (:class:`_LinearCrossEntropy`);
    under autocast the matmuls run in its dtype and the softmax in float32, as
    ``F.cross_entropy(logits.float())``. ``chunk`` rows at a time: 160 for BERT's 320-640 masked
    positions of a batch (the head + loss 73 ms against 86 at 64 rows and 148 unfused: 640 rows, 16k
    vocabulary, 128 hidden, 2 CPU threads), 256 for a decoder's every position."""
    return _LinearCrossEntropy.apply(hidden, weight, bias, targets, chunk)


def strip_wrappers(key: str) -> str:
    """A state-dict key without torch.compile's ``_orig_mod.`` and DDP's ``module.`` prefixes."""
    for prefix in ("_orig_mod.", "module."):
        while key.startswith(prefix):
            key = key[len(prefix) :]
    return key


def load_strict(module: nn.Module, sd: dict, source: str) -> None:
    own = module.state_dict()
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    if missing or unexpected:
        raise BertraceError(
            f"{source}: weights do not fit the model (missing {missing[:8]}, unexpected "
            f"{unexpected[:8]}); was it saved with a different model config?"
        )
    bad = [f"{k}: {tuple(sd[k].shape)} vs {tuple(v.shape)}" for k, v in own.items() if sd[k].shape != v.shape]
    if bad:
        raise BertraceError(
            f"{source}: weight shapes differ from the model config ({bad[:4]}); use the model "
            f"config the checkpoint was trained with"
        )
    module.load_state_dict(sd)
