"""This rank's values of a tensor that may be a DTensor (TP, FSDP2) or a plain tensor."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The shard (or replica) this rank holds, as a plain tensor sharing its storage; no communication."""
    return t.to_local() if isinstance(t, DTensor) else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor as a plain one: a collective over the DTensor's mesh (every rank must call it)."""
    return t.full_tensor() if isinstance(t, DTensor) else t
