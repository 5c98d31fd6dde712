"""Measure the bytes a forward pass leaves alive for backward.

Every storage an op creates during the forward is recorded (by weak reference); those still
alive when the forward returns are what autograd and the recompute policy hold for backward.
Counting storages at the dispatcher, rather than with torch.autograd.graph.saved_tensors_hooks,
also sees what activation checkpointing keeps (its own hooks take the place of any outer ones),
and counts a storage shared by several saved views once.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

if TYPE_CHECKING:
    from hlat.config.model import ModelConfig


class _NewStorages(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.created: list[weakref.ref[torch.UntypedStorage]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        # A view's storage is its base's: made earlier (or a parameter's), never new here.
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        self.created.extend(
            weakref.ref(t.untyped_storage())
            for t in tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs
        )
        return out


def bytes_saved_for_backward(forward: Callable[[], Any], exclude: Callable[[], Any] | None = None) -> int:
    """Bytes of the storages created by `forward()` that are still alive after it returns, the
    storages of its result excluded (the loss, or a block's output, is not saved state).
    Parameters and inputs exist before the call and are never counted."""
    mode = _NewStorages()
    with mode:
        result = forward()
    skip = {t.untyped_storage().data_ptr() for t in tree_leaves(result) if isinstance(t, torch.Tensor)}
    alive: dict[int, int] = {}
    for ref in mode.created:
        storage = ref()
        if storage is not None and storage.data_ptr() not in skip:
            alive[storage.data_ptr()] = storage.nbytes()
    del result
    return sum(alive.values())


def block_bytes(
    cfg: ModelConfig, policy: str, every_other_mm: bool, batch: int, seq: int, dtype: torch.dtype = torch.float32
) -> int:
    """Bytes one transformer block of `cfg` keeps for backward under recompute `policy`: what it
    saves, its input included (the previous block's output), measured on CPU."""
    from hlat.model import build_model
    from hlat.parallel.activation_checkpoint import apply_activation_checkpoint

    one = build_model(dataclasses.replace(cfg, n_layers=1, max_seq_len=max(seq, cfg.max_seq_len))).to(dtype)
    apply_activation_checkpoint(one, policy, every_other_mm)
    cos, sin = one.rope_cos[None, :, None], one.rope_sin[None, :, None]
    x = torch.randn(batch, seq, cfg.d_model, dtype=dtype, requires_grad=True)
    return bytes_saved_for_backward(lambda: one.layers["0"](x.clone(), cos, sin, None))


def model_bytes(cfg: ModelConfig, policy: str, every_other_mm: bool, batch: int, seq: int) -> int:
    """Bytes a whole fp32 model of `cfg` keeps for backward from its forward and training loss."""
    from hlat.model import build_model
    from hlat.parallel.activation_checkpoint import apply_activation_checkpoint
    from hlat.parallel.loss import token_loss_sum

    model = build_model(dataclasses.replace(cfg, max_seq_len=max(seq, cfg.max_seq_len)))
    apply_activation_checkpoint(model, policy, every_other_mm)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1))
    return bytes_saved_for_backward(lambda: token_loss_sum(model(tokens[:, :-1]), tokens[:, 1:]))
