"""Activation checkpointing: HLAT's selective recompute, or whole blocks.

"selective" recomputes exactly what HLAT did: core attention (QK^T, softmax, AV) and the SwiGLU
product, whose activations are large (T^2 per head, and FFN-wide) but cheap to recompute. Every
matmul with a weight is saved. "full" recomputes each transformer block from its input.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

aten = torch.ops.aten

# Ops of core attention and the SwiGLU product: recomputed in backward instead of stored.
_RECOMPUTE = {
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten.silu.default,
    aten.mul.Tensor,  # the SwiGLU product; also the cheap elementwise products of RMSNorm and RoPE
}


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:  # type: ignore[no-untyped-def]
    if op in _RECOMPUTE or op.overloadpacket in (aten._softmax, aten.bmm, aten.baddbmm):
        return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


def apply_activation_checkpoint(model: nn.Module, mode: str) -> None:
    if mode == "none":
        return
    for name, block in list(model.layers.items()):
        if mode == "full":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
        else:
            wrapped = checkpoint_wrapper(
                block, preserve_rng_state=False,
                context_fn=partial(create_selective_checkpoint_contexts, _policy),
            )
        model.layers[name] = wrapped
