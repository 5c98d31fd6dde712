"""The optimizers of a run: one per model part (pipeline stages), stepped together.

Their state is exchanged through `torch.distributed.checkpoint.state_dict`, keyed by parameter
names rather than positions, so it loads into any layout. Under ZeRO-1 (ZeroRedundancyOptimizer)
each rank holds the entries of the parameters its partition owns: every rank writes and reads
its own, and nothing is gathered to one rank.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from hlat.dtensor import local_tensor
from hlat.optim import skips_exactly

_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


class Optimizers:
    def __init__(self, parts: list[nn.Module], build: Callable[[nn.Module], torch.optim.Optimizer]):
        self.parts = parts
        self.optimizers = [build(part) for part in parts]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for opt in self.optimizers for group in opt.param_groups]

    def set_lr(self, lr: float) -> None:
        for group in self.param_groups:
            group["lr"] = lr

    def step(self, skip: torch.Tensor | None = None) -> None:
        """Step every optimizer; where the 0-d device flag `skip` is set, leave weights, moments and
        step counts untouched (no host sync). Optimizers without that ability (foreach AdamW, on
        devices with no fused kernel) step on zeroed gradients instead: weights still move by
        momentum and weight decay."""
        for opt in self.optimizers:
            inner = _local(opt)
            if skips_exactly(inner):
                inner.found_inf = None if skip is None else skip.to(torch.float32)
            elif skip is not None:
                _zero_grads_where(inner, skip)
            opt.step()

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def sharded_state_dict(self) -> dict[str, Any]:
        """Name-keyed state for torch.distributed.checkpoint."""
        return {
            k: v
            for part, opt in zip(self.parts, self.optimizers)
            for k, v in get_optimizer_state_dict(part, _local(opt), options=_FLAT).items()
        }

    def load_sharded_state_dict(self, state: dict[str, Any]) -> None:
        """Load by name; how the update runs stays this device's (see _keep_implementation)."""
        for part, opt in zip(self.parts, self.optimizers):
            local = _local(opt)
            own = [{k: group[k] for k in _IMPLEMENTATION if k in group} for group in local.param_groups]
            with _without_empty_groups(local):
                set_optimizer_state_dict(part, local, state, options=_FLAT)
            _keep_implementation(local, own)


@contextlib.contextmanager
def _without_empty_groups(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Hide the param groups that hold no parameter while a state loads: ZeRO-1's partition of a
    group can be empty on a rank (more ranks than that group's parameters), and torch's loader
    reads every group's first parameter name. They come back at their places after the load
    (ZeroRedundancyOptimizer matches its groups to the local optimizer's by position)."""
    groups = optimizer.param_groups
    empty = {i: group for i, group in enumerate(groups) if not group["params"]}
    if not empty:
        yield
        return
    optimizer.param_groups = [group for group in groups if group["params"]]
    try:
        yield
    finally:
        loaded = iter(optimizer.param_groups)
        optimizer.param_groups = [empty[i] if i in empty else next(loaded) for i in range(len(groups))]


# Param-group entries that say how an update runs on the device that built the optimizer, not what
# it computes: a checkpoint saved where AdamW is foreach (no fused kernel: Neuron, XPU, MPS, ...)
# loads into a device where it is fused, and the reverse, so these stay the loading device's; so
# does Muon's Newton-Schulz dtype, the run's choice for its hardware (optim.muon_ns_dtype).
_IMPLEMENTATION = ("fused", "foreach", "capturable", "ns_dtype")


@torch.no_grad()
def _keep_implementation(optimizer: torch.optim.Optimizer, own: list[dict[str, Any]]) -> None:
    """Put back this device's `_IMPLEMENTATION` entries after a load, and place each parameter's
    `step` counter where that implementation keeps it (torch's own rule at load: on the parameter's
    device, as float32, for fused or capturable; on the host otherwise)."""
    for group, entries in zip(optimizer.param_groups, own):
        if not entries:  # an optimizer of hlat's own (bf16 state) runs alike everywhere
            continue
        group.update(entries)
        on_device = bool(group.get("fused") or group.get("capturable"))
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if isinstance(step, torch.Tensor):
                device = local_tensor(param).device if on_device else torch.device("cpu")
                optimizer.state[param]["step"] = step.to(device=device, dtype=torch.float32)


def zero1_optimizer(params: Any, cls: type, group: Any, **kwargs: Any) -> torch.optim.Optimizer:
    """ZeRO-1: `cls` over this rank's partition of `params` among `group`'s ranks. Its module is
    imported here, on first use: importing torch.distributed.optim compiles TorchScript for eight
    functional optimizers (0.3 CPU-s of a tiny run's 3.5), which a run without ZeRO-1 never uses."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=group, **kwargs)


def _local(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that holds this rank's state: ZeRO-1's local one over its own partition (none
    exists before zero1_optimizer has imported its module)."""
    zero = sys.modules.get("torch.distributed.optim")
    return optimizer.optim if zero is not None and isinstance(optimizer, zero.ZeroRedundancyOptimizer) else optimizer


@torch.no_grad()
def _zero_grads_where(optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """Zero every gradient where `skip` is set, without reading it on the host (masked_fill, not
    multiplication: NaN x 0 is NaN)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                local_tensor(p.grad).masked_fill_(skip, 0.0)
