"""In-training validation: the loss on a fixed held-out set, every `every` optimizer steps.

The same batches every time (built once, before the loop), so the curve moves only because the
model does. Downstream tasks during training use the same harness as `hlat eval`; see
docs/evaluation.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hlat.train.precision import autocast

IGNORE_INDEX = -100  # hlat.data's label for "no target"


@dataclass
class EvalConfig:
    every: int = 0  # validation loss every N optimizer steps; 0 = never
    batches: int = 8  # held-out micro-batches per validation (fixed: the same tokens every time)

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        if self.every < 0:
            problems.append(("every", f"must be >= 0 (0 = no validation), got {self.every}"))
        if self.batches < 1:
            problems.append(("batches", f"must be >= 1, got {self.batches}; the validation set "
                             "is batches x train.micro_batch rows of data.seq_len tokens"))
        return problems

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0


@torch.no_grad()
def validation_loss(model: nn.Module, batches: Iterable, precision_mode: str) -> float:
    """Mean next-token cross-entropy (nats per target token) over every target of `batches`
    (hlat.data Batch objects on the model's device: tokens, labels, and with document masking
    positions and attn_mask). The model is put in eval mode and restored afterwards; the one
    host sync is the final .item()."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total = torch.zeros((), device=device, dtype=torch.float64)
    count = torch.zeros((), device=device, dtype=torch.long)
    try:
        for batch in batches:
            with autocast(precision_mode, device):
                logits = model(batch.tokens, positions=getattr(batch, "positions", None),
                               attn_mask=getattr(batch, "attn_mask", None))
            total += F.cross_entropy(logits.float().flatten(0, 1), batch.labels.flatten(),
                                     ignore_index=IGNORE_INDEX, reduction="sum").double()
            count += (batch.labels != IGNORE_INDEX).sum()
    finally:
        model.train(was_training)
    n = int(count.item())
    if n == 0:
        raise ValueError("validation batches have no targets (every label is ignored)")
    return float(total.item()) / n
