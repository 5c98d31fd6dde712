"""One optimizer step: accumulate over micro-batches, clip the global gradient norm, update."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hlat.data.batch import Batch
from hlat.parallel.elastic import Replicas
from hlat.parallel.parallelize import ParallelModel, global_target_count
from hlat.train.optimizers import Optimizers


def train_step(
    model: ParallelModel,
    optimizers: Optimizers,
    micro_batches: Sequence[Batch],
    grad_clip: float,
    skipped: torch.Tensor | None = None,
    max_grad_norm: float = 0.0,
    replicas: Replicas | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (this rank's share of the global mean loss, pre-clip global grad norm), on device.

    Every micro-batch's summed loss is divided by the target count of the whole global batch, so
    the gradient is that of the global mean however the batch is split across micro-batches and
    ranks. Nothing here reads a value back to the host.

    With `skipped` (a device counter), a step whose global gradient norm is not finite, or above
    `max_grad_norm` (> 0), is skipped by the optimizers on device (see Optimizers.step) and adds 1
    to the counter; the norm is the same on every rank, so all ranks skip the same steps.

    With `replicas` (an elastic run), the target count, gradients and loss are summed over the
    replica groups present too (the returned share is then the whole loss), and the optimizers
    step only if the step commits (replicas.committed); this group may hold no micro-batch.
    """
    device = next(iter(model.parameters())).device
    n_targets = global_target_count(micro_batches, model.layout) if micro_batches else torch.zeros((), device=device)
    if replicas is not None:
        n_targets = replicas.sum_(n_targets.to(torch.float64)).float().clamp_min(1.0)
    share = model.forward_backward(micro_batches, n_targets) if micro_batches else torch.zeros((), device=device)
    if replicas is not None:
        share = replicas.reduce_gradients(model.parameters(), share)
    grad_norm = model.clip_grad_norm_(grad_clip)
    bad = None
    if skipped is not None:
        bad = ~torch.isfinite(grad_norm)
        if max_grad_norm > 0:
            bad |= grad_norm > max_grad_norm
    if replicas is None or replicas.should_commit():
        if bad is not None:
            skipped += bad
        optimizers.step(bad)
    optimizers.zero_grad()
    return share, grad_norm
