"""One optimizer step: gradient accumulation over micro-batches, clipping, update."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hlat.data.packing import Batch
from hlat.train.precision import autocast

IGNORE_INDEX = -100


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy over the non-ignored targets, computed in fp32 whatever the compute dtype."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[Batch],
    precision_mode: str,
    grad_clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run one step and return (mean loss per target token, pre-clip global grad norm) on device.

    Each micro-batch's summed loss is divided by the target count of the whole global batch, so the
    gradient is that of the global mean however the batch is split. Nothing here syncs with the host.
    """
    device = next(model.parameters()).device
    n_targets = sum((b.labels != IGNORE_INDEX).sum() for b in micro_batches).clamp_min(1)
    loss_sum = torch.zeros((), device=device)
    for batch in micro_batches:
        with autocast(precision_mode, device):
            logits = model(batch.tokens)
        loss = token_loss_sum(logits, batch.labels)
        (loss / n_targets).backward()
        loss_sum += loss.detach()
    params = [p for p in model.parameters() if p.grad is not None]
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum / n_targets, grad_norm
