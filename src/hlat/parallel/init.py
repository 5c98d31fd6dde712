"""Layout-independent initialisation: every parameter is drawn from a generator seeded by
(seed, its name), so a model sharded by TP/FSDP or split into pipeline stages holds exactly the
values the single-device model would."""

from __future__ import annotations

import hashlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

# Wrappers insert these into parameter names; the state-dict name has none of them.
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")


def canonical_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}|{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


@torch.no_grad()
def init_parameters(model: nn.Module, init_std_of, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Initialise every parameter of `model` (possibly DTensors) and rebuild non-persistent buffers.

    `init_std_of(name)` gives the std of a normal init, or None for ones (norm weights).
    Each full tensor is drawn on the CPU, then this rank keeps its shard (no communication).
    """
    for raw_name, param in model.named_parameters():
        name = canonical_name(raw_name)
        std = init_std_of(name)
        if std is None:
            full = torch.ones(param.shape)
        else:
            full = torch.empty(param.shape).normal_(0.0, std, generator=_generator(seed, name))
        full = full.to(dtype=param.dtype)
        if isinstance(param, DTensor):
            local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
            param.to_local().copy_(local)
        else:
            param.copy_(full)
