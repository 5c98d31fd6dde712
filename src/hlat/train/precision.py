"""How each precision mode runs the forward and backward passes."""

from __future__ import annotations

import contextlib

import torch


def compute_dtype(mode: str) -> torch.dtype:
    return torch.bfloat16 if mode == "mixed" else torch.float32


def autocast(mode: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast for "mixed": matmuls in bf16, weights and reductions (norms, softmax) in fp32."""
    if mode == "mixed":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
