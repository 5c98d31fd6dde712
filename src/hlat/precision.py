"""The precision modes: how parameters are stored, how the passes compute, how the optimizer rounds.

| mode    | weights, grads, Adam moments | optimizer                  | compute                        |
|---------|------------------------------|----------------------------|--------------------------------|
| fp32    | fp32                         | torch AdamW (fused)        | fp32                           |
| mixed   | fp32 (HLAT 70B)              | torch AdamW (fused)        | bf16 weights, bf16 autocast    |
| bf16-sr | bf16 (HLAT 7B)               | BF16AdamW, stochastic      | bf16 on accelerators, see below |
| bf16    | bf16                         | BF16AdamW, to nearest      | bf16 on accelerators, see below |

On a CPU the bf16 storage modes compute in fp32 from the bf16 weights (each weight is upcast as
a matmul reads it): CPUs without bf16 instructions run bf16 matmuls 6-100x slower than fp32, and
what these modes study is the storage and rounding of the training state, which is unchanged.
Norms, RoPE, softmax statistics and the loss are fp32 in every mode (the model and loss do that).
`mixed` computes from a bf16 copy of every parameter (so the residual stream is bf16), the copy
FSDP2's MixedPrecisionPolicy gathers (hlat.parallel.data_parallel); gradients reach the fp32
parameters in fp32 and accumulate there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from hlat.dtensor import local_tensor

_BF16_STORAGE = {"bf16-sr": "stochastic", "bf16": "nearest"}  # modes: PrecisionConfig.mode's Literal


def param_dtype(mode: str) -> torch.dtype:
    """The dtype parameters, gradients and optimizer moments are stored in."""
    return torch.bfloat16 if mode in _BF16_STORAGE else torch.float32


def bf16_rounding(mode: str) -> str | None:
    """How the optimizer rounds its fp32 update into bf16 state ("stochastic"/"nearest"); None for fp32 state."""
    return _BF16_STORAGE.get(mode)


def compute_dtype(mode: str, device: torch.device | None = None) -> torch.dtype:
    """The dtype the matmuls run in on `device` (the MFU denominator's dtype); `device` None: on an
    accelerator, whichever (what `hlat plan` predicts for)."""
    if mode == "mixed" or (mode in _BF16_STORAGE and (device is None or device.type != "cpu")):
        return torch.bfloat16
    return torch.float32


@torch.no_grad()
def cast_parameters(model: nn.Module, mode: str) -> nn.Module:
    """Cast the parameters (not the buffers: RoPE tables stay fp32) to the mode's storage dtype.

    Call it before data-parallel wrapping or FSDP2 sharding (on the meta model is cheapest), so
    every wrapper allocates its buffers in the storage dtype.
    """
    dtype = param_dtype(mode)
    for param in model.parameters():
        if param.dtype != dtype:
            param.data = param.data.to(dtype)
    return model


class _UpcastWeights(TorchFunctionMode):
    """bf16-stored weights, fp32 compute (CPUs): embedding lookups come out fp32, so the residual
    stream is fp32, and the model's linear layers (hlat.model.llama.Linear) upcast their weights to
    it. The upcasts are part of the autograd graph, so gradients come back to the bf16 parameters
    as bf16 (rounded to nearest), exactly as bf16 compute would deliver them.
    """

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is F.embedding:
            return func(*args, **(kwargs or {})).float()
        return func(*args, **(kwargs or {}))


class Bf16Weights(TorchFunctionMode):
    """mixed on one device or DDP: every op reads each fp32 parameter as its bf16 copy.

    The same weights FSDP2's MixedPrecisionPolicy(param_dtype=bf16) gathers, so one device and
    FSDP2 compute alike (embedding output and residual stream bf16, norm weights bf16). The cast
    is in the autograd graph: each micro-batch's bf16 gradient reaches the parameter upcast to
    fp32 and accumulates in fp32. A parameter already bf16 (FSDP2's gathered copy) passes as is.

    With a `cache` (precision.bf16_weight_cache) each parameter is cast once while the cache
    lives (the caller clears it once per step) and every later read, in another micro-batch or a
    recompute, reuses that copy; gradients still reach the fp32 parameter, upcast.
    """

    def __init__(self, cache: dict[nn.Parameter, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.cache = cache

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if getattr(func, "__name__", "") == "__get__":  # attribute reads (shape, dtype) see the parameter
            return func(*args, **(kwargs or {}))
        return func(*(self._bf16_copy(a) for a in args), **(kwargs or {}))

    def _bf16_copy(self, t: Any) -> Any:
        if not (isinstance(t, nn.Parameter) and t.dtype == torch.float32):
            return t
        if self.cache is None:
            return t.to(torch.bfloat16)
        copy = self.cache.get(t)
        if copy is None:
            copy = self.cache[t] = t.detach().to(torch.bfloat16)
        return _CachedCopy.apply(t, copy)


class _CachedCopy(torch.autograd.Function):
    """`copy` (a cached bf16 cast of `param`) in the graph as `param.to(bf16)` would be: the
    gradient reaches `param` upcast to its dtype, as the cast's own backward delivers it."""

    @staticmethod
    def forward(ctx: Any, param: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:
        ctx.dtype = param.dtype
        return copy.view_as(copy)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.to(ctx.dtype), None


def _bf16(t: Any) -> Any:
    """`t` rounded to bf16 (to nearest) and held in fp32: exactly the value a bf16 unit reads."""
    return t.to(torch.bfloat16).float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t


class EmulatedBf16Compute(TorchFunctionMode):
    """bf16 matmuls at fp32 speed, for CPUs without bf16 units (studies, not training).

    Enter it below `autocast("mixed", ...)` (outside it): the mixed context still casts every
    parameter to its bf16 copy and keeps its fp32 ops fp32, and bf16 pointwise ops (residual
    stream, norms, SwiGLU) run natively, which is fast on any CPU. Only linear layers and attention,
    the ops a CPU without bf16 units emulates at ~1 GFLOP/s, are redirected: they read their inputs
    and weights rounded to bf16, multiply and accumulate in fp32 with autocast off (bf16 x bf16
    products are exact in fp32; bf16 matmul units accumulate in fp32 too) and round the output to
    bf16. Through autograd the gradients are rounded at the same points as a bf16 backward. Left
    out: summation order inside a kernel, and the internals of a fused attention kernel (softmax
    statistics are fp32 in both).
    """

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear or func is F.scaled_dot_product_attention:
            args = tuple(_bf16(a) for a in args)
            kwargs = {k: (v if k == "attn_mask" else _bf16(v)) for k, v in kwargs.items()}
            with torch.autocast(device_type=self.device_type, enabled=False):
                if func is F.linear:
                    return _Fp32Linear.apply(*args, **kwargs).to(torch.bfloat16)
                return func(*args, **kwargs).to(torch.bfloat16)
        return func(*args, **kwargs)


class _Fp32Linear(torch.autograd.Function):
    """F.linear whose backward matmuls also run in fp32: a backward called inside autocast would
    otherwise send them to (emulated, slow) bf16. Their results are rounded to bf16 by the caller's
    casts, as a bf16 backward rounds them."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        x, weight = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1])
        with torch.autocast(device_type=grad.device.type, enabled=False):
            return grad @ weight, rows.T @ x.reshape(-1, x.shape[-1]), rows.sum(0) if ctx.has_bias else None


@contextlib.contextmanager
def emulated_mixed(device: torch.device) -> Iterator[None]:
    """`mixed`'s numerics with bf16 matmuls emulated in fp32 (EmulatedBf16Compute)."""
    with EmulatedBf16Compute(device.type), autocast("mixed", device):
        yield


@contextlib.contextmanager
def _mixed(device: torch.device, cache: dict[nn.Parameter, torch.Tensor] | None) -> Iterator[None]:
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16), Bf16Weights(cache):
        yield


def autocast(
    mode: str, device: torch.device, bf16_cache: dict[nn.Parameter, torch.Tensor] | None = None
) -> contextlib.AbstractContextManager:
    """The context the forward (and backward) passes run in for `mode` on `device`; `bf16_cache`:
    under mixed, where the weights' bf16 copies are kept for reuse (Bf16Weights)."""
    if mode == "mixed":
        return _mixed(device, bf16_cache)
    if compute_dtype(mode, device) == torch.bfloat16:
        # For bf16 weights this changes little for matmuls, but keeps softmax and reductions fp32.
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if mode in _BF16_STORAGE:
        return _UpcastWeights()
    return contextlib.nullcontext()


def state_bytes_per_param(params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer | None = None) -> float:
    """Bytes of training state per parameter: weights + gradients + optimizer state, on this rank.

    Gradients are counted in the parameter's dtype (they exist between backward and step).
    Optimizer state is measured when it exists; before the first step (state is allocated lazily)
    both AdamW implementations are known to keep two moments in the parameter's dtype.
    """
    total = count = 0
    for p in params:
        local = local_tensor(p)
        count += local.numel()
        total += 2 * local.numel() * local.element_size()
        state = optimizer.state.get(p) if optimizer is not None else None
        if state:
            total += sum(local_tensor(t).nbytes for t in state.values() if isinstance(t, torch.Tensor) and t.ndim > 0)
        else:
            total += 2 * local.numel() * local.element_size()
    return total / max(count, 1)
