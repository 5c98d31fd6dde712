"""Sums whose bits do not depend on the layout: train.deterministic's reductions (docs/reproducibility.md).

A floating-point sum depends on the order of its additions. The deterministic mode fixes one order
for every gradient, loss and norm of a step, whichever rank computed which part:

- Gradients: a complete binary tree over the global batch's micro-batches in their global index
  (a power of two of them). With d data-parallel ranks, rank r computes micro-batch t*d + r at
  accumulation slot t, so each slot's d gradients are one subtree, summed across ranks in rank
  order (`tree_sum` after an all-to-all); the slots' sums then pair up locally in the tree's upper
  levels (`PairwiseSum`). dp 1 runs the same tree with d = 1. fp32 addition is commutative, so
  each node's bits are fixed by its two children, on any rank.
- The gradient norm: each row's sum of squares in fp64 (a row lies whole on one rank under FSDP2's
  dim-0 shards), gathered in global row order and summed once (`CanonicalNorm`); a fixed
  tensor-parallel degree adds its own fixed order.
- Losses: each micro-batch's, gathered by global index and summed as the gradients are.
- Elastic groups: each group present holds a whole subtree (`tree_blocks`); the groups' sums meet
  in the nodes above them (`sum_blocks`), so which groups are present changes no bit.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter  # the interface set_custom_reduce_scatter takes
from torch.distributed.tensor import DTensor


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def tree_sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum `parts` (a power of two of them) as a complete binary tree in their order."""
    assert is_power_of_two(len(parts)), len(parts)
    level = list(parts)
    while len(level) > 1:
        level = [level[i] + level[i + 1] for i in range(0, len(level), 2)]
    return level[0]


def tree_blocks(leaves: int, parts: int) -> list[range]:
    """`leaves` (a power of two) cut into `parts` (1 to leaves) whole subtrees of the complete binary
    tree over them, in leaf order: the first of the largest halved until there are `parts`."""
    assert is_power_of_two(leaves) and 1 <= parts <= leaves, (leaves, parts)
    blocks = [range(leaves)]
    while len(blocks) < parts:
        i = max(range(len(blocks)), key=lambda k: (len(blocks[k]), -k))
        half = len(blocks[i]) // 2
        blocks[i : i + 1] = [blocks[i][:half], blocks[i][half:]]
    return blocks


def sum_blocks(sums: Sequence[torch.Tensor], blocks: Sequence[range]) -> torch.Tensor:
    """The tree's root from the sums of its `blocks` (tree_blocks', in order): the nodes above them."""
    by_start = {block.start: (len(block), total) for block, total in zip(blocks, sums)}

    def node(start: int, size: int) -> torch.Tensor:
        if by_start.get(start, (0,))[0] == size:
            return by_start[start][1]
        half = size // 2
        return node(start, half) + node(start + half, half)

    return node(0, sum(len(block) for block in blocks))


class PairwiseSum:
    """Add lists of tensors one at a time; `total()` equals `tree_sum` over them, element by element,
    holding at most log2(count) + 1 partial sums (a binary counter)."""

    def __init__(self) -> None:
        self._stack: list[tuple[int, list[torch.Tensor]]] = []  # (subtree height, its sums)
        self._count = 0

    def add(self, tensors: list[torch.Tensor]) -> None:
        height, node = 0, tensors
        while self._stack and self._stack[-1][0] == height:
            _, left = self._stack.pop()
            node = [a + b for a, b in zip(left, node)]
            height += 1
        self._stack.append((height, node))
        self._count += 1

    def total(self) -> list[torch.Tensor]:
        assert len(self._stack) == 1 and is_power_of_two(self._count), f"{self._count} added: not a power of two"
        (_, node), self._stack, self._count = self._stack[0], [], 0
        return node


class GradientTap:
    """The SHA-256 of what is fed to it while open (a micro-batch's gradient tensors, in the order
    backward produces them)."""

    def __init__(self) -> None:
        self._hash: hashlib._Hash | None = None

    def open(self) -> None:
        self._hash = hashlib.sha256()

    def feed(self, tensor: torch.Tensor) -> None:
        if self._hash is not None:
            flat = tensor.detach().reshape(-1).contiguous().cpu()
            self._hash.update(flat.view(torch.uint8).numpy().tobytes())

    def close(self) -> bytes:
        digest, self._hash = self._hash.digest(), None
        return digest


def _ordered_chunk(flat: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """This rank's chunk (of `size` equal chunks of `flat`) summed over the group in rank order."""
    size = dist.get_world_size(group)
    received = torch.empty_like(flat)
    dist.all_to_all_single(received, flat, group=group)
    return tree_sum(list(received.chunk(size)))


def ordered_all_reduce_(tensors: list[torch.Tensor], group: dist.ProcessGroup | None) -> None:
    """Sum `tensors` over `group` in place, in rank order (a tree): the same bits on every rank and
    for every grouping of the same ordered values. The traffic of a ring all-reduce (an all-to-all
    and an all-gather)."""
    if group is None or dist.get_world_size(group) == 1 or not tensors:
        return
    size = dist.get_world_size(group)
    flat = torch.cat([t.reshape(-1) for t in tensors])
    padded = -flat.numel() % size
    if padded:
        flat = torch.cat([flat, flat.new_zeros(padded)])
    mine = _ordered_chunk(flat, group)
    gathered = torch.empty_like(flat)
    dist.all_gather_single(gathered, mine, group=group)
    offset = 0
    for t in tensors:
        t.copy_(gathered[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


class OrderedReduceScatter(ReduceScatter):
    """FSDP2's gradient reduce-scatter as a tree in rank order (FSDPModule.set_custom_reduce_scatter;
    its divide factor set to 1 and its reductions forced to sums). What this rank hands it (its own
    unsharded gradients) goes through `tap` too (hlat.train.replay's digests)."""

    def __init__(self, tap: GradientTap) -> None:
        self.tap = tap

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: object,
        async_op: bool = False,
    ) -> None:
        assert op == dist.ReduceOp.SUM, f"the ordered reduce-scatter sums, got {op}"
        self.tap.feed(input_tensor)
        output_tensor.copy_(_ordered_chunk(input_tensor, group))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _row_squares(grad: torch.Tensor) -> torch.Tensor:
    """Each row's (dim 0's) sum of squares, in fp64 (a square of an fp32 value is exact there)."""
    local = _local(grad).detach()
    rows = local.reshape(local.shape[0], math.prod(local.shape[1:])) if local.dim() > 1 else local.reshape(-1, 1)
    return rows.double().square().sum(dim=1)


def _split_over(grad: torch.Tensor, dim: str) -> bool:
    """Whether `grad` is split over mesh dim `dim` (else each of its ranks holds all of it)."""
    if not isinstance(grad, DTensor) or dim not in (grad.device_mesh.mesh_dim_names or ()):
        return False
    placement = grad.placements[grad.device_mesh.mesh_dim_names.index(dim)]
    assert not placement.is_partial(), f"a gradient still partial over {dim}: sum it before its norm"
    return placement.is_shard()


def _in_order(squares: list[torch.Tensor], group: dist.ProcessGroup, counts: list[list[int]]) -> list[torch.Tensor]:
    """Each tensor's row sums from every rank of `group`, in rank order; `counts[r][t]`: how many
    rows rank r holds of tensor t (a rank may hold none)."""
    size = dist.get_world_size(group)
    mine = squares[0].new_zeros(max(sum(c) for c in counts))
    flat = torch.cat(squares)
    mine[: flat.numel()] = flat
    gathered = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(gathered, mine, group=group)
    pieces = [g[: sum(c)].split(c) for g, c in zip(gathered, counts)]
    return [torch.cat([pieces[r][t] for r in range(size)]) for t in range(len(squares))]


class CanonicalNorm:
    """The L2 norm of a list of gradients, the same bits however their rows are sharded over
    `shard_group` (FSDP2's dim-0 shards: rank r holds the r-th run of consecutive rows; None: whole
    tensors), for a fixed tensor-parallel degree (`tp_group`: a tensor split over it is gathered in
    tp rank order, one held whole by every tp rank counts once), for a fixed number of pipeline
    stages (`pp_group`: each stage's fp64 sum, added in stage order). Each tensor's row sums are put
    back in order before one fp64 sum; fp32 result. How many rows each rank holds is fixed by the
    shapes: it is gathered at the first call, so a norm then costs one all-gather per group and no
    host sync."""

    def __init__(
        self,
        shard_group: dist.ProcessGroup | None,
        tp_group: dist.ProcessGroup | None = None,
        pp_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.groups = {
            name: group
            for name, group in (("shard", shard_group), ("tp", tp_group), ("pp", pp_group))
            if group is not None and dist.get_world_size(group) > 1
        }
        self._counts: dict[str, list[list[int]]] = {}  # group name -> every rank's rows per tensor

    def __call__(self, grads: list[torch.Tensor], device: torch.device | None = None) -> torch.Tensor:
        """`device`: where a rank without gradients puts its zero (a pipeline stage still adds it)."""
        total = torch.zeros((), dtype=torch.float64, device=device)
        if grads:
            squares = [_row_squares(g) for g in grads]
            if "shard" in self.groups:
                squares = self._gather("shard", squares)
            if "tp" in self.groups:
                first = dist.get_rank(self.groups["tp"]) == 0
                squares = self._gather(
                    "tp", [s if _split_over(g, "tp") or first else s[:0] for s, g in zip(squares, grads)]
                )
            total = torch.cat(squares).sum()
        if "pp" in self.groups:
            stages = [torch.empty_like(total) for _ in range(dist.get_world_size(self.groups["pp"]))]
            dist.all_gather(stages, total, group=self.groups["pp"])
            total = sum(stages[1:], stages[0])
        return total.sqrt().float()

    def _gather(self, name: str, squares: list[torch.Tensor]) -> list[torch.Tensor]:
        group = self.groups[name]
        if name not in self._counts:
            every: list[list[int]] = [[] for _ in range(dist.get_world_size(group))]
            dist.all_gather_object(every, [s.numel() for s in squares], group=group)
            self._counts[name] = every
        return _in_order(squares, group, self._counts[name])
