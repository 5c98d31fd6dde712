"""The training loss: summed next-token cross-entropy in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hlat.data.packing import IGNORE_INDEX


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy over the non-ignored targets, in fp32 whatever the compute dtype.

    Under tensor parallel the logits are a vocab-sharded DTensor and this runs inside
    `loss_parallel`, so the full logits are never gathered.
    """
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
