"""Tied embeddings under pipeline parallelism, as Megatron does it.

The first stage looks tokens up in the matrix and the last stage's output head multiplies by it,
so each holds a copy: hlat.parallel.pipeline.cut_stage keeps both under the name
`tok_embeddings.weight`, so they are initialised to the same values (hlat.parallel.init draws by
name), land in the same optimizer group and are saved as one checkpoint tensor. After backward
each copy's gradient becomes the sum of both uses' gradients (one all-reduce over the two ranks
holding the first and the last stage at the same dp/tp coordinates), so both copies take the same
optimizer step and stay bit-identical. Norms count the matrix once, on the first stage.

Stages are dealt round-robin over pp > 1 ranks (the last, pp x stages_per_rank - 1, goes to pp
rank pp - 1), so no rank holds both copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from hlat.dtensor import local_tensor
from hlat.parallel.mesh import Layout, collective_timeout


@dataclass
class TiedEmbeddings:
    stage: nn.Module  # this rank's first or last stage (the raw Llama, not a wrapper)
    group: dist.ProcessGroup  # the ranks of the first and the last stage at this rank's dp/tp coordinates
    counted: bool  # this rank's copy counts in gradient and parameter norms (the first stage's)

    @property
    def weight(self) -> nn.Parameter:
        # read at each use: FSDP2 registers its sharded Parameter between steps
        return self.stage.tok_embeddings.weight

    @torch.no_grad()
    def sum_gradients(self) -> None:
        """Both copies' gradient := the embedding's + the output head's (each rank its own shard)."""
        weight = self.weight
        if isinstance(weight.grad, DTensor) and weight.grad.placements != weight.placements:
            # TP's vocab-parallel embedding leaves a Replicate gradient of its Shard(0) weight;
            # taking this rank's rows (no communication) makes both copies' local shapes equal
            weight.grad = weight.grad.redistribute(weight.device_mesh, weight.placements)
        dist.all_reduce(local_tensor(weight.grad), group=self.group)


def embedding_groups(layout: Layout) -> dist.ProcessGroup | None:
    """Every pipeline's (first rank, last rank) as a group; this rank's one, or None on a middle
    stage. Collective over the world: every rank creates every group, in the same order."""
    pipelines = layout.mesh.mesh.movedim(0, -1).reshape(-1, layout.pp)  # a row: one pipeline's ranks by pp rank
    group, _ = dist.new_subgroups_by_enumeration(
        [[int(p[0]), int(p[-1])] for p in pipelines], timeout=collective_timeout()
    )
    return group


def tie_across_stages(
    stages: list[nn.Module], indices: list[int], n_stages: int, layout: Layout
) -> TiedEmbeddings | None:
    """The tied copy this rank holds (`stages[k]` is stage `indices[k]`), or None: no tied
    embeddings, no pipeline, or a middle stage."""
    if layout.pp == 1 or not stages[0].cfg.tie_embeddings:
        return None
    group = embedding_groups(layout)
    for stage, index in zip(stages, indices):
        if index in (0, n_stages - 1):
            return TiedEmbeddings(stage, group, counted=index == 0)
    return None
