"""Data parallelism over the mesh's dp dim: DDP, ZeRO-1, or FSDP2 (ZeRO-2 / ZeRO-3)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn.parallel import DistributedDataParallel

from hlat.errors import ConfigError


def check_data_parallel(sharding: str, dp: int, tp: int, pp: int) -> None:
    if dp == 1:
        return
    if sharding == "ddp" and (tp > 1 or pp > 1):
        # DDP's reducer supports neither DTensor weights nor the pipeline's split backward passes.
        raise ConfigError([("parallel.dp_sharding", "ddp is 1-D data parallel only; with tp or pp use zero2 (same memory as ddp "
                            "for weights during the step, sharded gradients and optimizer state) or fsdp")])
    if sharding == "zero1" and (tp > 1 or pp > 1):
        raise ConfigError([("parallel.dp_sharding", "zero1 (ZeroRedundancyOptimizer) is 1-D data parallel only; with tp or pp use zero2, "
                            "which shards the optimizer state as ZeRO-1 does and the gradients too, at the same communication volume")])


def apply_data_parallel(model: nn.Module, mesh: DeviceMesh, sharding: str, dp: int, tp: int) -> nn.Module:
    """Wrap `model` for data parallelism; returns the module to run (DDP wraps, FSDP2 is in place)."""
    if dp == 1:
        return model
    if sharding in ("zero2", "fsdp"):
        # With tp > 1 FSDP2 shards over dp the DTensors that TP already placed on the tp dim.
        dp_mesh = mesh["dp"]
        reshard = sharding == "fsdp"
        for block in model.layers.values():
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard)
        return model
    # ddp and zero1 both replicate the weights and all-reduce gradients; zero1 shards the optimizer.
    return DistributedDataParallel(model, process_group=mesh["dp"].get_group(), broadcast_buffers=False)


@contextlib.contextmanager
def no_gradient_sync(model: nn.Module, skip: bool) -> Iterator[None]:
    """Skip the gradient reduction on non-final micro-batches of an accumulated step."""
    if not skip:
        yield
    elif isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield
