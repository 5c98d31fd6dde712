"""The train module of an elastic replica group: the same step, with the target count, the
gradients and the loss summed over the groups present, and the update applied only where every
group's collectives succeeded (hlat.train.elastic.replicas). A step that does not commit leaves the
weights, the optimizer and the logged losses as they were, and says so (StepOutput.committed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from hlat.data.batch import Batch
from hlat.train.elastic.replicas import Replicas
from hlat.train.train_module import TrainModule

if TYPE_CHECKING:  # the group is built around this module (it serves the module's state)
    from hlat.train.elastic.group import ElasticGroup


class ElasticTrainModule(TrainModule):
    """A TrainModule whose group (hlat.train.elastic.group) attaches itself once it exists."""

    group: ElasticGroup

    @property
    def replicas(self) -> Replicas:
        return self.group.replicas

    def _target_count(self, micro_batches: Sequence[Batch]) -> torch.Tensor:
        # this group may hold no micro-batch this step; every group divides by the same count
        return self.replicas.sum_(super()._target_count(micro_batches).to(torch.float64)).float().clamp_min(1.0)

    def _reduce(self, rank_loss: torch.Tensor) -> torch.Tensor:
        return self.replicas.reduce_gradients(self.model.parameters(), rank_loss)

    def _commit(self) -> bool:
        committed = self.replicas.should_commit()
        self.group.finish(committed)  # the data shares keep their new positions, or go back
        return committed
