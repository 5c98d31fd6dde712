"""Data parallelism over the mesh's dp dim (dp and cp flattened with context parallelism): DDP, ZeRO-1, or FSDP2 (ZeRO-2 / ZeRO-3, and HSDP)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from hlat.config.precision import PrecisionConfig
from hlat.parallel.mesh import Layout, fsdp_mesh
from hlat.parallel.ordered_sum import GradientTap, OrderedReduceScatter

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def mixed_precision_policy(precision: PrecisionConfig) -> MixedPrecisionPolicy:
    """FSDP2's casts for a precision setting (docs/precision.md).

    mixed: the fp32 shards are cast to bf16 before the all-gather (gathers move bf16, compute
    reads bf16 weights, as single-device mixed does with hlat.precision.Bf16Weights) and gradients
    are reduce-scattered, and accumulated across micro-batches, in `reduce_dtype`. bf16 storage
    with fp32_grad_accum: bf16 weights, gradients accumulated and reduced in fp32, rounded to bf16
    once per step. Forward inputs are not cast: RoPE tables stay fp32.
    """
    if precision.mode == "mixed":
        return MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=DTYPES[precision.reduce_dtype], cast_forward_inputs=False
        )
    return MixedPrecisionPolicy(
        reduce_dtype=torch.float32 if precision.fp32_grad_accum else None, cast_forward_inputs=False
    )


# DDP's per-forward buffer sync is off (the RoPE tables are the same on every rank); torch 2.13 renames
# the flag and warns on every rank for the old name. Buffers are synced at init either way.
NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else {"broadcast_buffers": False}
)


def apply_data_parallel(
    model: nn.Module, layout: Layout, sharding: str, precision: PrecisionConfig, tap: GradientTap | None = None
) -> nn.Module:
    """Wrap `model` for data parallelism; returns the module to run (DDP wraps, FSDP2 is in place).
    With a `tap` (train.deterministic): FSDP2 sums each micro-batch's gradients in rank order
    (hlat.parallel.ordered_sum) and feeds them to the tap; replicated weights are not wrapped, the
    train module sums them."""
    if layout.degrees.dp_cp == 1:
        return model
    if sharding in ("zero2", "fsdp"):
        # With tp > 1 FSDP2 shards over dp the DTensors that TP already placed on the tp dim.
        dp_mesh, policy = fsdp_mesh(layout), mixed_precision_policy(precision)
        reshard = sharding == "fsdp"
        units = [*model.layers.values(), model]
        for unit in units:
            fully_shard(unit, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
        if tap is not None:
            for unit in units:
                unit.set_custom_reduce_scatter(OrderedReduceScatter(tap))
                unit.set_gradient_divide_factor(1.0)  # losses are scaled by the global target count alone
                unit.set_force_sum_reduction_for_comms(True)
        return model
    if tap is not None:
        return model
    # ddp and zero1 both replicate the weights and all-reduce gradients; zero1 shards the optimizer.
    return DistributedDataParallel(model, process_group=layout.group("dp_cp"), **NO_BUFFER_SYNC)


@contextlib.contextmanager
def no_gradient_sync(model: nn.Module, skip: bool, reshard_after_backward: bool = True) -> Iterator[None]:
    """Skip the gradient reduction on non-final micro-batches of an accumulated step.

    Under FSDP2 the unsharded gradients then stay on each rank until the final micro-batch
    reduce-scatters their sum; with `reshard_after_backward` false the gathered weights stay too,
    so the next micro-batch does not gather them again.
    """
    if not skip:
        yield
    elif isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(False)
        model.set_reshard_after_backward(reshard_after_backward)
        try:
            yield
        finally:  # read in post-backward only: the final micro-batch syncs and reshards
            model.set_requires_gradient_sync(True)
            model.set_reshard_after_backward(True)
    else:
        yield
