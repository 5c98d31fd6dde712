"""Layout-independent initialisation where each shard lives: element i of a parameter is a pure
function of (seed, parameter name, i) (hlat.parallel.init_values), so every rank computes only
the elements it holds, on the parameter's device, and a model sharded by TP/FSDP or split into
pipeline stages holds exactly the values the single-device model would."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from hlat.dtensor import local_tensor
from hlat.parallel.init_values import init_values, parameter_key, value_scale

# Wrappers insert these into parameter names; the state-dict name has none of them.
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")
CHUNK = 1 << 18  # elements computed at once: a few int64 temporaries of 2 MiB (the fastest of 2^14-2^20 on CPU)


def canonical_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def shard_indices(param: torch.Tensor, device: torch.device | None = None) -> list[torch.Tensor]:
    """For each dim, the global indices of this rank's elements, in the local tensor's order, on
    `device` (default: the parameter's).

    Each sharded mesh dim splits them as distribute_tensor splits the tensor (torch.chunk, uneven
    splits included; FSDP2's _StridedShard over a tensor-parallel dim interleaves); Replicate keeps
    them all. Only these 1-D index vectors are built, never the full tensor.
    """
    indices = [torch.arange(n, device=device or local_tensor(param).device) for n in param.shape]
    if not isinstance(param, DTensor):
        return indices
    coordinate = param.device_mesh.get_coordinate()
    assert coordinate is not None, "init on a rank outside the parameter's mesh"
    for mesh_dim, placement in enumerate(param.placements):
        if placement.is_replicate():
            continue
        dim = placement.dim  # type: ignore[attr-defined]  # Shard or _StridedShard
        pieces, _ = placement._split_tensor(
            indices[dim].view([1] * dim + [-1]),
            param.device_mesh.size(mesh_dim),  # type: ignore[attr-defined]
            with_padding=False,
        )
        indices[dim] = pieces[coordinate[mesh_dim]].reshape(-1)
    local_shape = tuple(local_tensor(param).shape)
    if tuple(len(i) for i in indices) != local_shape:
        raise RuntimeError(
            f"shard indices {[len(i) for i in indices]} do not match the local shape {local_shape} "
            f"of a parameter placed {param.placements}"
        )
    return indices


def _fill(param: torch.Tensor, name: str, std: float, seed: int, on_host: bool) -> None:
    """This rank's elements of `param` from the global-index function, CHUNK elements at a time,
    computed where the parameter lives or, `on_host`, on the CPU and copied over."""
    local = local_tensor(param)
    where = torch.device("cpu") if on_host else local.device
    indices = shard_indices(param, where)
    strides = [math.prod(param.shape[d + 1 :]) for d in range(param.dim())]
    # Global offsets within a row, by broadcasting (at least 1-D).
    inner = torch.zeros([1] * max(1, param.dim() - 1), dtype=torch.long, device=where)
    for d in range(1, param.dim()):
        inner = inner + indices[d].view(-1, *[1] * (param.dim() - 1 - d)) * strides[d]
    k0, k1 = parameter_key(seed, name)
    scale = value_scale(std)
    rows = max(1, CHUNK // max(1, inner.numel()))
    for start in range(0, local.shape[0], rows):
        block = local[start : start + rows]
        block.copy_(init_values(indices[0][start : start + rows], inner, strides[0], k0, k1, scale).view(block.shape))


@torch.no_grad()
def init_parameters(
    model: nn.Module, init_std_of: Callable[[str], float | None], seed: int, on_host: bool = False
) -> None:
    """Initialise every parameter of `model` (possibly DTensors) where it lives; no communication.
    `on_host`: compute the values on the CPU and copy them (DeviceRecord.init_on_host: a device
    that would run the value function's int64 arithmetic as host fallbacks, op by op).

    `init_std_of(name)` gives the std (hlat.parallel.init_values for the distribution), or None for
    ones (norm weights). Eager torch ops: compiling the value function (bit-identical) was ~3x
    faster per element on a CPU, but its compilation cost more than it saved on a first start
    (benchmarks/init_startup.md) and would be one more compilation that can fail on accelerators.
    """
    for raw_name, param in model.named_parameters():
        name = canonical_name(raw_name)
        std = init_std_of(name)
        if std is None:
            local_tensor(param).fill_(1.0)
        elif std == 0.0:
            local_tensor(param).zero_()
        else:
            _fill(param, name, std, seed, on_host)
