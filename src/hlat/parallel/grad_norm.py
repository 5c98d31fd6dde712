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
    shards, dims = [], []
    groups: dict[str, dist.ProcessGroup] = {}
    for t in tensors:
        names: set[str] = set()
        if isinstance(t, DTensor):
            mesh = t.device_mesh
            for i, placement in enumerate(t.placements):
                if placement.is_partial():
                    raise ValueError(f"a norm over a partial tensor ({t.placements}): settle its sum first")
                # any other placement splits the tensor (Shard, FSDP2-over-TP's _StridedShard)
                if not placement.is_replicate() and mesh.size(i) > 1:
                    name = mesh.mesh_dim_names[i] if mesh.mesh_dim_names else str(i)
                    groups[name] = mesh.get_group(i)
                    names.add(name)
            t = t.to_local()
        shards.append(t)
        dims.append(names)
    if not groups:
        return torch.nn.utils.get_total_norm(shards, foreach=True)
    squares = torch.stack(torch._foreach_norm(shards, 2.0, dtype=torch.float32)).square()
    # one all-reduce per mesh dimension, over the tensors sharded on it; dimensions in a global
    # order (by name), so that no two ranks wait on each other's groups
    for name in sorted(groups):
        rows = torch.tensor([i for i, names in enumerate(dims) if name in names])
        summed = squares[rows]
        dist.all_reduce(summed, group=groups[name])
        squares[rows] = summed
    return squares.sum().sqrt().to(functools.reduce(torch.promote_types, (t.dtype for t in shards)))
