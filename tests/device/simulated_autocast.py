"""Autocast for the simulated accelerator (tests/device/simulated_device.py): the CPU's cast lists and
weight cache on the AutocastPrivateUse1 key, so `mixed` on the simulated device gives the CPU's
numbers bit for bit."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

# torch's AutocastCPU lists (aten/src/ATen/autocast_mode.cpp), the subset a decoder reaches: the
# simulated device casts exactly as the CPU does, so `mixed` gives the CPU's numbers.
_LOWER = {
    "mm", "bmm", "addmm", "addbmm", "baddbmm", "_addmm_activation", "linear", "matmul", "linalg_vecdot",
    "scaled_dot_product_attention", "conv1d", "conv2d", "conv3d", "_convolution", "prelu",
}  # fmt: skip
_FP32 = {
    "mse_loss", "nll_loss", "nll_loss2d", "cross_entropy_loss", "l1_loss", "huber_loss", "smooth_l1_loss",
    "kl_div", "binary_cross_entropy", "binary_cross_entropy_with_logits", "prod", "cdist", "trace",
}  # fmt: skip
_PROMOTE = {"stack", "cat", "index_copy"}


def register_autocast(device_type: str) -> tuple[torch.library.Library, ...]:
    """Every operator falls through the device's autocast key but those of the CPU's lists; return
    the libraries (they must stay alive for the registrations to hold)."""
    everything = torch.library.Library("_", "IMPL")
    everything.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    autocast = torch.library.Library("aten", "IMPL")
    for policy, names in (("lower", _LOWER), ("fp32", _FP32), ("promote", _PROMOTE)):
        for name in names:
            packet = getattr(torch.ops.aten, name)
            for overload in packet.overloads():
                op = getattr(packet, overload)
                autocast.impl(op, _autocast(op, policy, device_type), "AutocastPrivateUse1")
    return everything, autocast


def _autocast(op: Any, policy: str, device_type: str) -> Callable[..., Any]:
    """The AutocastPrivateUse1 kernel of `op`: the CPU's cast for `policy`, then the keys below."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        tree = (args, kwargs)
        if policy == "lower":
            low = torch.get_autocast_dtype(device_type)
            tree = _cast(tree, device_type, lambda t: t.dtype in (torch.float32, torch.float16, torch.bfloat16), low)
        elif policy == "fp32":
            tree = _cast(tree, device_type, lambda t: t.dtype in (torch.float16, torch.bfloat16), torch.float32)
        else:
            floats = [t.dtype for t in _tensors(tree) if t.is_floating_point()]
            if floats:
                widest = functools.reduce(torch.promote_types, floats)
                tree = _cast(tree, device_type, lambda t: t.dtype != widest, widest)
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)):
            return op(*tree[0], **tree[1])

    return kernel


def _tensors(tree: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    tree_map(lambda v: found.append(v) if isinstance(v, torch.Tensor) else v, tree)
    return found


def _cast(tree: Any, device_type: str, eligible: Callable[[torch.Tensor], bool], dtype: torch.dtype) -> Any:
    def cast(value: Any) -> Any:
        if (
            isinstance(value, torch.Tensor)
            and value.device.type == device_type
            and value.is_floating_point()
            and eligible(value)
        ):
            return _cached_cast(value, dtype)
        return value

    return tree_map(cast, tree)


_casts: dict[int, tuple[tuple[int, torch.dtype, bool], torch.Tensor]] = {}


def _cached_cast(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Autocast's weight cache: a leaf that requires grad (a parameter) is cast once, and all its uses
    share that one cast node, so their gradients are summed in `dtype` before the cast back, as on
    the CPU. torch clears its cache when the autocast region ends, which a Python backend cannot
    see: this one keys on the tensor's version and grad mode, which gives the same values."""
    if not (value.requires_grad and value.is_leaf and value._base is None and torch.is_autocast_cache_enabled()):
        return value.to(dtype)
    key = (value._version, dtype, torch.is_grad_enabled())
    hit = _casts.get(id(value))
    if hit is not None and hit[0] == key:
        return hit[1]
    if hit is None:
        weakref.finalize(value, _casts.pop, id(value), None)
    cast = value.to(dtype)
    _casts[id(value)] = (key, cast)
    return cast
