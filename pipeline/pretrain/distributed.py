"""What the pre-training loop needs of ``torch.distributed`` (DDP over ranks; one process is world 1),
and its autocast context.

Decisions taken on a clock (a ``time_minutes`` budget, ``checkpoint_minutes``) use rank 0's clock,
broadcast over a CPU group so the host keeps running ahead of the GPU."""

from __future__ import annotations

import torch
import torch.distributed as dist

from pipeline.models import checkpoint as ckpt_lib


def rank_and_world() -> tuple[int, int]:
    """``(rank, world size)`` of the initialised process group; ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce(t: torch.Tensor, world: int) -> torch.Tensor:
    """``t`` summed over the ranks, in place."""
    if world > 1:
        dist.all_reduce(t)
    return t


def cpu_group(world: int):
    """A process group whose collectives run on the CPU: the default one under gloo, else a gloo
    group over the same ranks (a collective call: every rank creates it). None for one process."""
    if world == 1 or dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


def broadcast_float(value: float, device: torch.device, world: int, group=None) -> float:
    """Rank 0's value on every rank (clocks differ; decisions must not). A CPU tensor over a CPU
    group (:func:`cpu_group`): no GPU→CPU synchronisation, so the host keeps running ahead of
    the GPU (``device`` is not used; kept for callers)."""
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.broadcast(t, src=0, group=group)
    return float(t.item())


def gather_rng(world: int, rank: int) -> list[dict] | None:
    """Every rank's RNG states on rank 0 (None on the others): a collective call."""
    state = ckpt_lib.rng_state()
    if world == 1:
        return [state]
    out = [None] * world if rank == 0 else None
    dist.gather_object(state, out, dst=0)
    return out


def autocast(device: torch.device, dtype: torch.dtype | None):
    """Mixed precision in ``dtype`` on ``device``; None: off (fp32)."""
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)
