"""The global L2 norm of tensors that may be DTensors, computed from each rank's own shards.

torch's `get_total_norm` and `clip_grads_with_norm_` dispatch `_foreach_norm` and `_foreach_mul_`
through DTensor, whose sharding propagation plans a list op by expanding every element's
strategies over the whole mesh: on torch 2.13 that first plan costs more than the training step
itself for a small model under TP or FSDP2 x TP (benchmarks/first_step.md), and it is paid again
for every new mesh. The norm needs none of it: square each rank's shards, sum the squares over
the mesh dimensions a tensor is sharded on (a replica counts once), one all-reduce per dimension.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def total_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of `tensors` over every shard, the same value on every rank of their meshes, in the
    dtype torch's norm would have. Every rank of a mesh passes its shards of the same tensors; a
    DTensor must not be partial (hlat.dtensor.settled_grad settles a gradient first). Nothing
    sharded: torch's own `get_total_norm`, bit for bit."""
    shards: list[torch.Tensor] = []
    split_on: list[tuple[str, ...]] = []  # the names of the mesh dimensions each tensor is split on
    groups: dict[str, dist.ProcessGroup] = {}
    for t in tensors:
        names: tuple[str, ...] = ()
        if isinstance(t, DTensor):
            mesh = t.device_mesh
            for i, placement in enumerate(t.placements):
                if placement.is_partial():
                    raise ValueError(f"a norm over a partial tensor ({t.placements}): settle its sum first")
                # any other placement splits the tensor (Shard, FSDP2-over-TP's _StridedShard)
                if not placement.is_replicate() and mesh.size(i) > 1:
                    name = mesh.mesh_dim_names[i] if mesh.mesh_dim_names else str(i)
                    groups[name] = mesh.get_group(i)
                    names += (name,)
            t = t.to_local()
        shards.append(t)
        split_on.append(tuple(sorted(names)))
    if not groups:
        return torch.nn.utils.get_total_norm(shards, foreach=True)
    norms = torch._foreach_norm(shards, 2.0, dtype=torch.float32)
    # the squares summed per set of dimensions (stacked on the device: no index from the host, so
    # no wait for the backward's kernels), then one all-reduce per dimension over the sets split
    # on it, dimensions in a global order (by name), so that no two ranks wait on each other's groups
    squares = {
        key: torch.stack([n for n, k in zip(norms, split_on) if k == key]).square().sum()
        for key in sorted(set(split_on))
    }
    for name in sorted(groups):
        keys = [key for key in squares if name in key]
        summed = torch.stack([squares[key] for key in keys])
        dist.all_reduce(summed, group=groups[name])
        squares.update(zip(keys, summed.unbind()))
    return (
        torch.stack(list(squares.values()))
        .sum()
        .sqrt()
        .to(functools.reduce(torch.promote_types, (t.dtype for t in shards)))
    )
