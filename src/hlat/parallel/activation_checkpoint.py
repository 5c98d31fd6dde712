"""Activation checkpointing: which activations a transformer block keeps for backward.

"selective" is HLAT's policy: core attention (QK^T, softmax, AV) and the SwiGLU product are
recomputed, whose activations are large (T^2 per head without a fused kernel, and FFN-wide) but
cheap to recompute; every other op's output is saved. With `recompute_attention` false (CUDA's
default, parallel.recompute_attention) a fused attention kernel's output is saved instead. "op" is the policy GPU stacks use
(torchtitan's op-level SAC): the outputs of the matmuls with a weight and of fused attention are
saved, and the cheap pointwise rest (norms, RoPE, SiLU, products) is recomputed; with
`every_other_mm` only every other matmul's output is saved. "full" recomputes each block from its
input. Context parallelism's ring attention (one operator) is saved under selective and op:
replaying it would pass the keys and values around the ring again. Measured bytes and step times
per policy: benchmarks/recompute.md.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from functools import partial

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.overrides import _get_current_function_mode_stack
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext, create_selective_checkpoint_contexts

from hlat.device.record import device_record
from hlat.model.ring_attention import RING_ATTENTION

aten = torch.ops.aten

_FUSED_ATTENTION = {
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    # FlexAttention (document masking on CUDA) reaches the policy as this higher-order operator.
    torch.ops.higher_order.flex_attention,
}

# "selective": ops of core attention and the SwiGLU product, recomputed in backward.
_RECOMPUTE = _FUSED_ATTENTION | {
    aten.silu.default,
    aten.mul.Tensor,  # the SwiGLU product; also the cheap elementwise products of RMSNorm and RoPE
}

# "op": matmuls with a weight (nn.Linear lowers to mm, or addmm with a bias).
_MATMULS = {aten.mm.default, aten.addmm.default}
# "op": outputs saved; everything else is recomputed. The reduce-scatter of sequence parallelism
# is saved so that recompute adds no communication.
_SAVE = _MATMULS | _FUSED_ATTENTION | {RING_ATTENTION, torch.ops._c10d_functional.reduce_scatter_tensor.default}


class _NoInPlaceWarning(logging.Filter):
    """Drops torch's one-line reminder, logged once per compiled run with a policy's context_fn,
    that a checkpointed region must hold no in-place op. hlat's blocks hold none, under every
    precision mode and model variant (tests/parallel/test_activation_checkpoint.py records each op
    of a block's forward), so the line is noise in every compiled recompute log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "context_fn is passed to torch.utils.checkpoint" not in record.getMessage()


_NO_IN_PLACE_WARNING = _NoInPlaceWarning()


def attention_recomputed(setting: str, device: torch.device) -> bool:
    """parallel.recompute_attention for `selective` on `device`: "auto" is the device's choice
    (hlat.device.record: fused attention is saved on CUDA GPUs, replayed elsewhere)."""
    return device_record(device.type).recompute_fused_attention if setting == "auto" else setting == "true"


def _selective_policy(
    recompute_attention: bool, ctx: SelectiveCheckpointContext, op, *args, **kwargs
) -> CheckpointPolicy:  # type: ignore[no-untyped-def]
    if op is RING_ATTENTION:  # replaying it would send the K/V around the ring again
        return CheckpointPolicy.MUST_SAVE
    if op in _FUSED_ATTENTION:
        return CheckpointPolicy.PREFER_RECOMPUTE if recompute_attention else CheckpointPolicy.MUST_SAVE
    if op in _RECOMPUTE:
        return CheckpointPolicy.PREFER_RECOMPUTE
    # The policy also sees higher-order operators (FlexAttention, regions torch compiled), which
    # are no OpOverload: they have neither is_view nor an overload packet, and are saved.
    # Views are recomputed: free to redo, and a saved view would keep a recomputed tensor's
    # storage alive (the reshaped SwiGLU product or attention output on its way into a matmul).
    if isinstance(op, torch._ops.OpOverload) and (
        op.is_view or op.overloadpacket in (aten._softmax, aten.bmm, aten.baddbmm)
    ):
        return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


def _op_policy(
    every_other_mm: bool, counts: Counter[bool], ctx: SelectiveCheckpointContext, op, *args, **kwargs
) -> CheckpointPolicy:  # type: ignore[no-untyped-def]
    if op not in _SAVE:
        return CheckpointPolicy.PREFER_RECOMPUTE
    if every_other_mm and op in _MATMULS:
        # Counted separately in forward and in recompute, so both make the same choices.
        counts[ctx.is_recompute] += 1
        if counts[ctx.is_recompute] % 2 == 0:
            return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


def _op_contexts(every_other_mm: bool):  # type: ignore[no-untyped-def]
    # A fresh matmul count for each checkpointed call of a block.
    return create_selective_checkpoint_contexts(partial(_op_policy, every_other_mm, Counter()))


def checkpoint_block(
    block: nn.Module,
    mode: str,
    every_other_mm: bool = False,
    compiled: bool = False,
    recompute_attention: bool = True,
) -> nn.Module:
    """`block` wrapped for recompute policy `mode` (selective, op, full); unchanged for none.
    `compiled`: the block will be compiled, where the recompute replays the traced graph (which
    holds the precision casts) and torch accepts only the policy's own contexts.
    `recompute_attention`: under selective, replay fused attention (else its output is saved)."""
    if mode == "none":
        return block
    if mode == "full":
        if compiled:
            return checkpoint_wrapper(block, preserve_rng_state=False)
        contexts = partial(tuple, (contextlib.nullcontext(), contextlib.nullcontext()))
    elif mode == "selective":
        contexts = partial(create_selective_checkpoint_contexts, partial(_selective_policy, recompute_attention))
    else:
        contexts = partial(_op_contexts, every_other_mm)
    if compiled:  # the same instance is added once
        logging.getLogger("torch._higher_order_ops.wrap").addFilter(_NO_IN_PLACE_WARNING)
    context_fn = contexts if compiled else partial(_under_forward_modes, contexts)
    return checkpoint_wrapper(block, preserve_rng_state=False, context_fn=context_fn)


def _under_forward_modes(contexts):  # type: ignore[no-untyped-def]
    """The policy's (forward, recompute) contexts, the recompute also under the torch-function
    modes active in the forward (hlat.precision's weight casts): backward runs outside them, and a
    recompute without them would compute in other dtypes than the forward it replays."""
    forward, recompute = contexts()
    return forward, _entered(recompute, _get_current_function_mode_stack())


@contextlib.contextmanager
def _entered(context, modes):  # type: ignore[no-untyped-def]
    with contextlib.ExitStack() as stack:
        for function_mode in modes:
            stack.enter_context(function_mode)
        stack.enter_context(context)
        yield


def apply_activation_checkpoint(
    model: nn.Module, mode: str, every_other_mm: bool = False, compiled: bool = False, recompute_attention: bool = True
) -> None:
    """Wrap each transformer block of `model` for recompute policy `mode` (none, selective, op, full)."""
    for name, block in list(model.layers.items()):
        model.layers[name] = checkpoint_block(block, mode, every_other_mm, compiled, recompute_attention)
