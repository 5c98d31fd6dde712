"""One optimizer step: accumulate over micro-batches, clip the global gradient norm, update.

The phases are separate functions so that a train module which reduces gradients further (an
elastic group: hlat.train.elastic.module) composes the same step around them rather than copying it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hlat.data.batch import Batch
from hlat.parallel.parallelize import ParallelModel, global_target_count
from hlat.train.optimizers import Optimizers


def target_count(model: ParallelModel, micro_batches: Sequence[Batch]) -> torch.Tensor:
    """The target count of the whole global batch over the model's ranks (0 for no micro-batch)."""
    if not micro_batches:
        return torch.zeros((), device=next(iter(model.parameters())).device)
    return global_target_count(micro_batches, model.layout)


def accumulate(model: ParallelModel, micro_batches: Sequence[Batch], n_targets: torch.Tensor) -> torch.Tensor:
    """Forward and backward over the micro-batches; this rank's part of the global mean loss."""
    if not micro_batches:
        return torch.zeros((), device=n_targets.device)
    return model.forward_backward(micro_batches, n_targets)


def clip(
    model: ParallelModel, grad_clip: float, max_grad_norm: float, norm: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pre-clip global grad norm, whether the step must be skipped), on device: a norm that is not
    finite, or above `max_grad_norm` (> 0), skips it; the norm is the same on every rank. `norm`:
    the gradients' global norm computed otherwise (train.deterministic's)."""
    grad_norm = model.clip_grad_norm_(grad_clip, norm)
    bad = ~torch.isfinite(grad_norm)
    if max_grad_norm > 0:
        bad |= grad_norm > max_grad_norm
    return grad_norm, bad


def update(optimizers: Optimizers, bad: torch.Tensor | None, skipped: torch.Tensor | None) -> None:
    """Step the optimizers unless `bad` (on device, see Optimizers.step), counting a skip in `skipped`."""
    if skipped is not None and bad is not None:
        skipped += bad
    optimizers.step(bad)


def train_step(
    model: ParallelModel,
    optimizers: Optimizers,
    micro_batches: Sequence[Batch],
    grad_clip: float,
    skipped: torch.Tensor | None = None,
    max_grad_norm: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (this rank's part of the global mean loss, pre-clip global grad norm), on device.

    Every micro-batch's summed loss is divided by the target count of the whole global batch, so
    the gradient is that of the global mean however the batch is split across micro-batches and
    ranks. Nothing here reads a value back to the host.

    With `skipped` (a device counter), a step whose global gradient norm is not finite, or above
    `max_grad_norm` (> 0), is skipped by the optimizers on device and adds 1 to the counter; all
    ranks skip the same steps.
    """
    rank_loss = accumulate(model, micro_batches, target_count(model, micro_batches))
    grad_norm, bad = clip(model, grad_clip, max_grad_norm)
    update(optimizers, bad if skipped is not None else None, skipped)
    optimizers.zero_grad()
    return rank_loss, grad_norm
