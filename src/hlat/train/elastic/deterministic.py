"""The train module of an elastic group under train.deterministic: the same bits as one process
running the whole global batch, whichever groups are present at each step (docs/reproducibility.md).

Each group holds a whole subtree of the step's summation tree (its shares: hlat.train.elastic.shares)
and sums it as train.deterministic does inside one run (hlat.train.deterministic); the groups' subtree
sums then meet in the nodes above them (hlat.parallel.ordered_sum.sum_blocks), computed alike on
every group. The sums travel as bytes: each group writes its own row of a table that is otherwise
zero and the table is summed as integers over the groups present, so every group reads each row
exactly as it was sent, whatever order the all-reduce adds in (a float sum of one value and zeros
could still turn -0.0 into +0.0). The price is traffic: the table is groups x this rank's gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hlat.data.batch import Batch
from hlat.dtensor import local_tensor
from hlat.parallel.ordered_sum import sum_blocks, tree_blocks
from hlat.parallel.parallelize import ParallelModel
from hlat.train.deterministic import DeterministicTrainModule
from hlat.train.elastic.module import ElasticTrainModule
from hlat.train.replay import WrongComputation


class ElasticDeterministicTrainModule(ElasticTrainModule, DeterministicTrainModule):
    """Accumulation, clipping, losses and replay as DeterministicTrainModule's inside the group; the
    target count and the group's sums over the groups present; the commit vote as
    ElasticTrainModule's. `wrong_computation` (recovery.wrong_computation): when this group's
    replay names a node, "exclude" ends this group before the exchange (the others' step fails
    and is retried without it), "stop" tells every group in the exchange, and all of them stop."""

    def __init__(self, model: ParallelModel, *, wrong_computation: str = "stop", **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.wrong_computation = wrong_computation
        self.found: str | None = None  # this step's replay finding, told to the other groups (stop)

    def _computing_wrong(self, line: str) -> None:
        if self.wrong_computation == "exclude":
            raise WrongComputation(
                f"{line}; this group leaves the run (recovery.wrong_computation exclude) and the others retry "
                "the step without it: take the named node out before starting this group again"
            )
        self.found = line

    def _target_count(self, micro_batches: Sequence[Batch]) -> torch.Tensor:
        return self.replicas.sum_(self._exact_count(micro_batches)).float().clamp_min(1.0)

    def _reduce(self, group_loss: torch.Tensor) -> torch.Tensor:
        """This group's subtree sums (gradients in .grad, `group_loss`) exchanged byte for byte, then
        the tree's upper nodes: the global batch's gradient and loss on every rank of every group."""
        params = list(self.model.parameters())
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        parts = [local_tensor(g) for g in grads] + [group_loss.reshape(1)]
        found = torch.tensor([self.found is not None], dtype=torch.uint8, device=group_loss.device)
        row = torch.cat([part.detach().reshape(-1).view(torch.uint8) for part in parts] + [found])
        present, rank = self.group.present, self.group.rank
        table = row.new_zeros(present, row.numel())
        table[rank] = row
        self.replicas.sum_(table)
        self._stop_if_found(table[:, -1].tolist())
        blocks = tree_blocks(self.group.data.shares, present)
        offset = 0
        for part in parts:
            size = part.numel() * part.element_size()
            rows = [table[g, offset : offset + size].clone().view(part.dtype).view_as(part) for g in range(present)]
            part.copy_(sum_blocks(rows, blocks))
            offset += size
        for param, grad in zip(params, grads):
            param.grad = grad
        return parts[-1].reshape(())

    def _stop_if_found(self, found: list[int]) -> None:
        """recovery.wrong_computation stop: every group present stops once any group's replay named
        a node (each group's own log names it)."""
        finders = [rank for rank, flag in enumerate(found) if flag]
        if not finders or self.replicas.failed():
            return
        stop = "every elastic group stops (recovery.wrong_computation stop)"
        if self.found is not None:
            raise WrongComputation(f"{self.found}; {stop}: take the named node out of the job before resuming")
        raise WrongComputation(
            f"replay: replica rank(s) {finders} of this step's quorum found a node computing wrong at step "
            f"{self.number} (their log names it); {stop}"
        )
