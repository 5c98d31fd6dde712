"""fp32 gradient accumulation for bf16-stored parameters where FSDP2 does not do it.

FSDP2 accumulates in its MixedPrecisionPolicy's reduce_dtype (hlat.parallel.data_parallel); on
one device, with tensor or pipeline parallelism and no FSDP2, this does it: each bf16 micro-batch
gradient is added into an fp32 sum as backward delivers it, and the sum is rounded to bf16 once,
after the step's last micro-batch. DDP is not supported (its reducer owns .grad).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


class Fp32GradAccumulator:
    def __init__(self, params: Iterable[nn.Parameter]) -> None:
        self._sums: dict[nn.Parameter, torch.Tensor] = {}
        self._handles = [p.register_post_accumulate_grad_hook(self._add) for p in params if p.requires_grad]

    def _add(self, param: nn.Parameter) -> None:
        grad, param.grad = param.grad, None  # bf16 never holds a sum of micro-batches
        total = self._sums.get(param)
        if total is None:
            self._sums[param] = grad.float()
        else:
            total += grad

    @torch.no_grad()
    def finish(self) -> None:
        """Round each fp32 sum to the parameter's dtype into .grad (once per step)."""
        for param, total in self._sums.items():
            param.grad = total.to(param.dtype)
        self._sums.clear()
