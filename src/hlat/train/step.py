"""One optimizer step: accumulate over micro-batches, clip the global gradient norm, update."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hlat.data.packing import Batch
from hlat.parallel.parallelize import ParallelModel, global_target_count
from hlat.train.optimizers import Optimizers


def train_step(model: ParallelModel, optimizers: Optimizers, micro_batches: Sequence[Batch], grad_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (this rank's share of the global mean loss, pre-clip global grad norm), on device.

    Every micro-batch's summed loss is divided by the target count of the whole global batch, so
    the gradient is that of the global mean however the batch is split across micro-batches and
    ranks. Nothing here reads a value back to the host.
    """
    n_targets = global_target_count(micro_batches, model.layout)
    share = model.forward_backward(micro_batches, n_targets)
    grad_norm = model.clip_grad_norm_(grad_clip)
    optimizers.step()
    optimizers.zero_grad()
    return share, grad_norm
