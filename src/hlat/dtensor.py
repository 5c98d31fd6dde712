"""This rank's values of a tensor that may be a DTensor (TP, FSDP2) or a plain tensor."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The shard (or replica) this rank holds, as a plain tensor sharing its storage; no communication."""
    return t.to_local() if isinstance(t, DTensor) else t


def settled_grad(p: torch.Tensor) -> torch.Tensor | None:
    """`p`'s gradient in `p`'s own placements, stored back as `p.grad`. Under tensor parallelism a
    gradient can come back in another layout than its parameter (a pending sum for a replicated
    norm weight, or KV projections replicated over tp): one redistribution here serves the norm
    and the optimizer, which read it shard by shard."""
    g = p.grad
    if isinstance(g, DTensor) and isinstance(p, DTensor) and tuple(g.placements) != tuple(p.placements):
        g = p.grad = g.redistribute(p.device_mesh, p.placements)
    return g


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor as a plain one: a collective over the DTensor's mesh (every rank must call it)."""
    return t.full_tensor() if isinstance(t, DTensor) else t
