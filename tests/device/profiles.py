"""Device profiles for the simulated accelerator: what a real backend offers and refuses, as a
device record plus the behaviour behind it, so the wiring hlat chooses for that backend runs in
the suite against the backend's contract rather than the CPU's.

CUDA_LIKE offers CUDA's flash attention operator for the model's attention in fp16 and bf16
(flash_api.h's contract: those dtypes, head dimensions up to 256, grouped K/V heads read in place,
a log-sum-exp of [B, H, M] floats); its cuDNN attention operator, with the refusals of
aten/src/ATen/native/transformers/cuda/sdp_utils.cpp's can_use_cudnn_attention on an H100 (sm90)
under the cuDNN runtime torch 2.13.0's Linux wheel installs (first in SDPA's order there), and the
outputs of torch/_meta_registrations.py's meta__scaled_dot_product_cudnn_attention; and
its memory-efficient attention operator, the one context parallelism's ring calls per chunk pair
there (DeviceRecord.ring_kernel "efficient"), computed on the host with the CUDA kernel's
conventions (aten/src/ATen/native/transformers/cuda/mem_eff_attention, kernel_forward.h and
kernel_backward.h, as shipped in torch 2.13's headers): the output laid out [B, M, H, D] in memory;
a log-sum-exp of [B, H, ceil(M / 32) * 32] floats, its padding +inf; a fully masked row's output 0
and log-sum-exp 0; the bias of the query's dtype with its batch, head and row strides multiples of
16 elements ("attn_bias is not correctly aligned"); the same number of query and key heads; a
backward that reads the log-sum-exp in whole 32-query blocks.

NEURON_LIKE follows TorchNeuron (awsdocs-neuron, "torch.compile backend reference", 2026-10-14):
its compile backend rejects dynamic=True ("dynamic=True is rejected during compilation ...
recompiling per new shape"), and it has no fused AdamW kernel. The backend here refuses any graph
with a symbolic size or scalar and otherwise runs the captured graph as it is (the host kernels
behind the simulated device), so numerics stay the CPU's.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch._dynamo import register_backend
from torch.fx.experimental.symbolic_shapes import free_symbols
from torch.nn.attention import SDPBackend

from device import simulated_device
from hlat.device import record

NEURON_LIKE_BACKEND = "hlat_neuron_like"
REFUSES_EVERYTHING = "hlat_refuses_everything"
GRAPHS: list[int] = []  # the node counts of the graphs NEURON_LIKE_BACKEND accepted


def _symbolic(value: Any) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.Tensor)) and bool(free_symbols(value))


@register_backend(name=NEURON_LIKE_BACKEND)
def _neuron_like(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    placeholders = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    if any(_symbolic(v) for v in placeholders):
        raise RuntimeError("dynamic=True is rejected during compilation (symbolic sizes or scalars in the graph)")
    GRAPHS.append(len(gm.graph.nodes))
    return gm.forward


@register_backend(name=REFUSES_EVERYTHING)
def _refuses(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    raise RuntimeError("this compiler takes no graph")


NEURON_LIKE = record.DeviceRecord(
    simulated_device.TYPE, compile_backend=NEURON_LIKE_BACKEND, compile_dynamic=False, init_on_host=True
)

_LSE_ALIGN, _BIAS_ALIGN = 32, 16  # kernel_forward.h: kAlignLSE; kAlignmentQ of the fp32 and 16-bit kernels


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, dropout: float) -> None:
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise RuntimeError(
            f"efficient attention: q, k, v of one dtype among fp32, fp16, bf16, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if not (q.size(1) == k.size(1) == v.size(1)):
        raise RuntimeError(
            f"efficient attention: the same number of heads in q, k, v, got {q.size(1)}, {k.size(1)}, {v.size(1)}"
        )
    if dropout != 0.0:
        raise RuntimeError("this profile computes dropout 0 only")
    if bias is None:
        return
    if bias.dtype != q.dtype:
        raise RuntimeError(f"efficient attention: attn_bias of the query's dtype {q.dtype}, got {bias.dtype}")
    b, h, m, _ = bias.shape
    for dim, size, what in ((0, b, "strideB"), (1, h, "strideH"), (2, m, "strideM")):
        if size > 1 and bias.stride(dim) % _BIAS_ALIGN:
            raise RuntimeError(
                f"attn_bias is not correctly aligned ({what}): {bias.stride(dim)} is no multiple of {_BIAS_ALIGN}"
            )


def _scores(
    q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None, causal: bool, scale: float | None
) -> torch.Tensor:
    s = (q.float() @ k.float().transpose(-1, -2)) * (q.size(-1) ** -0.5 if scale is None else scale)
    if bias is not None:
        s = s + bias.float()
    if causal:  # from the top left, as the kernel's CausalFromTopLeft
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    return s


def _efficient_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: torch.Tensor | None,
    compute_log_sumexp: bool,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_inputs(q, k, v, attn_bias, dropout_p)
    s = _scores(q, k, attn_bias, is_causal, scale)
    peak = s.amax(-1, keepdim=True)
    peak = peak.masked_fill(peak == -math.inf, 0.0)  # a fully masked row: max 0, sum 1 (log 0)
    e = torch.exp(s - peak)
    total = e.sum(-1, keepdim=True)
    total = total.masked_fill(total == 0, 1.0)
    out = ((e / total) @ v.float()).to(q.dtype).transpose(1, 2).contiguous().transpose(1, 2)
    m = q.size(2)
    lse = (peak + torch.log(total)).squeeze(-1)
    lse = F.pad(lse, (0, -m % _LSE_ALIGN), value=math.inf) if compute_log_sumexp else lse[..., :0]
    no_dropout = torch.empty((), dtype=torch.long)
    return out, lse, no_dropout, no_dropout.clone()


def _efficient_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: torch.Tensor | None,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    philox_seed: torch.Tensor,
    philox_offset: torch.Tensor,
    dropout_p: float,
    grad_input_mask: list[bool],
    is_causal: bool = False,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    _check_inputs(q, k, v, attn_bias, dropout_p)
    m = q.size(2)
    if logsumexp.size(-1) < -(-m // _LSE_ALIGN) * _LSE_ALIGN:
        raise RuntimeError(f"efficient attention backward: logsumexp of {logsumexp.size(-1)} rows for {m} queries")
    softmax_scale = q.size(-1) ** -0.5 if scale is None else scale
    p = torch.exp(_scores(q, k, attn_bias, is_causal, scale) - logsumexp[..., :m, None].float())
    g = grad_out.float()
    dv = p.transpose(-1, -2) @ g
    dp = g @ v.float().transpose(-1, -2)
    ds = p * (dp - (g * out.float()).sum(-1, keepdim=True))
    dq, dk = (ds @ k.float()) * softmax_scale, (ds.transpose(-1, -2) @ q.float()) * softmax_scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def _check_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, causal: bool) -> None:
    """flash_api.h's mha_fwd / mha_bwd contract, as its checks word it."""
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError(f"FlashAttention only support fp16 and bf16 data type, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.size(-1) > 256:
        raise RuntimeError(f"FlashAttention forward only supports head dimension at most 256, got {q.size(-1)}")
    if k.size(1) != v.size(1) or q.size(1) % k.size(1):
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")
    if causal and q.size(2) != k.size(2):  # sdp_utils' check_flash_causal_non_square_seqlens: sdpa never asks
        raise RuntimeError("this profile's flash kernel computes a square causal mask only")
    if dropout != 0.0:
        raise RuntimeError("this profile computes dropout 0 only")


def _grouped(t: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V read by each query head, as the kernel reads a group's one K/V head in place."""
    return t.repeat_interleave(heads // t.size(1), dim=1)


def _grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, is_causal: bool, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 attention with grouped K/V heads read in place, and its log-sum-exp [B, H, M, 1]: the
    flash and cuDNN kernels' forward, before each lays its outputs out as its own."""
    s = _scores(q, _grouped(k, q.size(1)), bias, is_causal, scale)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    return torch.exp(s - lse) @ _grouped(v, q.size(1)).float(), lse


def _flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
) -> tuple:
    """`_scaled_dot_product_flash_attention` as CUDA returns it (torch/_meta_registrations.py's
    meta__scaled_dot_product_flash_attention): the output laid out [B, M, H, D] in memory, a
    log-sum-exp of [B, H, M] floats (no padding, flash_api.h's softmax_lse), no cumulative
    sequence lengths, the sequence lengths, a philox seed of two uint64 and an offset of one."""
    _check_flash(q, k, v, dropout_p, is_causal)
    out, lse = _grouped_attention(q, k, v, None, is_causal, scale)
    out, lse = out.to(q.dtype).transpose(1, 2).contiguous().transpose(1, 2), lse.squeeze(-1)
    seed, offset = torch.zeros(2, dtype=torch.uint64), torch.zeros((), dtype=torch.uint64)
    no_mask = torch.empty(0, dtype=q.dtype)
    return out, lse, None, None, q.size(2), k.size(2), seed, offset, no_mask


def _flash_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    cum_seq_q: torch.Tensor | None,
    cum_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    philox_seed: torch.Tensor,
    philox_offset: torch.Tensor,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients from the forward's own log-sum-exp ([B, H, M], read as is); a K/V head's
    gradient summed over the query heads of its group."""
    _check_flash(q, k, v, dropout_p, is_causal)
    if logsumexp.shape != q.shape[:3]:
        raise RuntimeError(f"flash attention backward: softmax_lse of shape {tuple(logsumexp.shape)} for {q.shape[:3]}")
    dq, dk, dv = _grouped_attention_grads(grad_out, q, k, v, out, logsumexp[..., None], None, is_causal, scale)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _grouped_attention_grads(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    bias: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 gradients of attention from its output and [B, H, M, 1] log-sum-exp, K/V heads read in
    place for their group of query heads (a K/V head's gradient summed over the group)."""
    kk, vv = _grouped(k, q.size(1)).float(), _grouped(v, q.size(1)).float()
    softmax_scale = q.size(-1) ** -0.5 if scale is None else scale
    p = torch.exp(_scores(q, kk, bias, is_causal, scale) - logsumexp.float())
    g = grad_out.float()
    ds = p * (g @ vv.transpose(-1, -2) - (g * out.float()).sum(-1, keepdim=True))
    dq, dk = (ds @ kk) * softmax_scale, (ds.transpose(-1, -2) @ q.float()) * softmax_scale
    dk = dk.unflatten(1, (k.size(1), -1)).sum(2)
    dv = (p.transpose(-1, -2) @ g).unflatten(1, (v.size(1), -1)).sum(2)
    return dq, dk, dv


# The profile's H100 runs torch 2.13.0's Linux x86_64 wheel from PyPI, a CUDA 13 build whose METADATA
# requires nvidia-cudnn-cu13==9.20.0.48: cuDNN runtime 9.20.0, as versionRuntimeCuDNN counts it. What
# that runtime decides in sdp_utils.cpp (read at pytorch commit 001f694a; torch 2.13 ships its
# headers, not it), on sm90:
# - check_prefer_cudnn_attention: a runtime above 9.15.0 on sm90 (minor 0 or 3 only in CUDA 12
#   builds) puts cuDNN first, unless TORCH_CUDNN_SDPA_DEPRIORITIZED is true;
# - check_cudnn_tensor_shapes: head dims up to 128, or a query and key of 192 with a value of 128
#   (from 9.11); 256 only above 9.22 with cuDNN frontend 1.24; each a multiple of 8; batch and
#   heads up to 65535;
# - dropout is refused only by runtimes 9.11 to 9.13 (this profile computes dropout 0 only).
_CUDNN_RUNTIME = 92000
_CUDNN_HEAD_DIM, _CUDNN_HEAD_ALIGN, _CUDNN_MAX_DIM = 128, 8, 65535
_CUDNN_FIRST = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _cudnn_head_dim_limit(d_qk: int, d_v: int) -> int:
    """check_cudnn_tensor_shapes' head_dim_limit on sm90 at _CUDNN_RUNTIME."""
    return 192 if _CUDNN_RUNTIME >= 91100 and (d_qk, d_v) == (192, 128) else _CUDNN_HEAD_DIM


def _cudnn_kernel_refusal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """What of q, k, v cuDNN's SDPA graph cannot take on sm90: sdp_utils.cpp's
    check_dtypes_low_precision, check_tensor_shapes, check_cudnn_tensor_shapes and the head count of
    check_batch_size_and_num_heads_dense (grouped K/V heads dividing the query's); None: it takes them."""
    d_qk, d_v = q.size(-1), v.size(-1)
    refusals = (
        (
            q.dtype == k.dtype == v.dtype and q.dtype in (torch.float16, torch.bfloat16),
            f"query, key and value of dtype {{Half, BFloat16}}, got {q.dtype}, {k.dtype}, {v.dtype}",
        ),
        (q.dim() == k.dim() == v.dim() == 4, "4-dimensional query, key and value"),
        (max(q.size(0), q.size(1)) <= _CUDNN_MAX_DIM, f"batch size and heads at most {_CUDNN_MAX_DIM}"),
        (
            max(d_qk, d_v) <= (limit := _cudnn_head_dim_limit(d_qk, d_v)),
            f"head_dim no more than {limit}, got {d_qk} and {d_v}",
        ),
        (not (d_qk % _CUDNN_HEAD_ALIGN or d_v % _CUDNN_HEAD_ALIGN), f"head_dim a multiple of 8, got {d_qk}, {d_v}"),
        (k.size(2) != 1, "a key/value sequence longer than 1"),
        (
            q.size(0) == k.size(0) == v.size(0) and q.size(1) % k.size(1) == 0 and q.size(1) % v.size(1) == 0,
            "one batch size, and key/value heads dividing the query's",
        ),
    )
    return next((f"cuDNN SDPA needs {needs}" for ok, needs in refusals if not ok), None)


def _cudnn_sdpa_refusal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout: float, enable_gqa: bool
) -> str | None:
    """sdp_utils.cpp's can_use_cudnn_attention for dense inputs on sm90 (check_cudnn_hardware_support
    passes there): the backend enabled, not under deterministic algorithms, a mask of no gradient
    and a shape check_attn_mask_shape takes, dropout in 1/16ths, K/V heads as many as the query's
    unless enable_gqa, a last dimension of stride 1, then what the kernel takes."""
    mask_dims = (
        (q.size(2), k.size(2)) if mask is None or mask.dim() == 2 else (q.size(0), q.size(1), q.size(2), k.size(2))
    )
    refusals = (
        (torch.backends.cuda.cudnn_sdp_enabled(), "cuDNN attention has been runtime disabled"),
        (
            not torch.are_deterministic_algorithms_enabled() or torch.is_deterministic_algorithms_warn_only_enabled(),
            "cuDNN SDPA is not deterministic",
        ),
        (
            mask is None
            or (
                not mask.requires_grad
                and mask.dim() == len(mask_dims)
                and all(m in (1, n) for m, n in zip(mask.shape, mask_dims))
            ),
            "an attn_mask of no gradient, 2-d or 4-d, each dim 1 or the inputs'",
        ),
        (dropout * 16 == math.floor(dropout * 16), "a dropout probability in multiples of 1/16"),
        (
            enable_gqa or q.size(1) == k.size(1) == v.size(1),
            "as many key/value heads as query heads without enable_gqa",
        ),
        (
            all(t.stride(-1) == 1 for t in (q, k, v)) or q.size(-1) == 1,
            "query, key and value with a last dimension of stride 1",
        ),
        (mask is None or mask.stride(-1) == 1, "an attn_mask with a last dimension of stride 1"),
        (min(q.size(2), k.size(2)) > 0, "nonzero sequence lengths"),
    )
    refused = next((f"cuDNN SDPA needs {needs}" for ok, needs in refusals if not ok), None)
    return refused or _cudnn_kernel_refusal(q, k, v)


_priority_set = False  # sdp_utils.cpp's priority_order_init_: once a process (here: each profile() entered)


def _priority_order() -> list[SDPBackend]:
    """sdp_utils.cpp's priority_order: at a process's first selection, cuDNN first where
    check_prefer_cudnn_attention holds (_CUDNN_RUNTIME above 9.15.0 on sm90, unless
    TORCH_CUDNN_SDPA_DEPRIORITIZED is "1", c10::utils::check_env's true), then the global order as it
    stands, which sdpa_kernel(..., set_priority=True) sets."""
    global _priority_set
    if not _priority_set:
        _priority_set = True
        if _CUDNN_RUNTIME > 91500 and os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED") != "1":
            torch._C._set_sdp_priority_order([int(b) for b in _CUDNN_FIRST])
    return [SDPBackend(b) for b in torch._C._get_sdp_priority_order()]


def _check_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float) -> None:
    """The operator called as it is, outside SDPA's selection: what its kernel cannot compute."""
    if (refused := _cudnn_kernel_refusal(q, k, v)) is not None:
        raise RuntimeError(refused)
    if dropout != 0.0:
        raise RuntimeError("this profile computes dropout 0 only")


def _in_query_layout(q: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """`t` laid out as _meta_registrations' alloc_with_matching_layout lays the output out: like the
    query where the shapes agree, else its dimensions in the query's order of strides."""
    if t.shape == q.shape:
        return torch.empty_like(q).copy_(t)
    order = sorted(range(q.dim()), key=q.stride, reverse=True)
    return t.permute(order).contiguous().permute([order.index(d) for d in range(q.dim())])


def _cudnn_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: torch.Tensor | None,
    compute_log_sumexp: bool,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
) -> tuple:
    """`_scaled_dot_product_cudnn_attention` as meta__scaled_dot_product_cudnn_attention gives it:
    the output [B, H, M, Dv] laid out as the query, a log-sum-exp of [B, H, M, 1] floats (allocated
    whether asked for or not), no cumulative sequence lengths, the sequence lengths, a philox seed
    and offset of 0-d int64, no debug mask. Grouped K/V heads are read in place; the bias (the
    query's dtype, broadcast over batch and heads) adds to the scaled scores."""
    _check_cudnn(q, k, v, dropout_p)
    out, lse = _grouped_attention(q, k, v, attn_bias, is_causal, scale)
    out = _in_query_layout(q, out.to(q.dtype))
    seed, offset = torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long)
    return out, lse, None, None, q.size(2), k.size(2), seed, offset, None


def _cudnn_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    philox_seed: torch.Tensor,
    philox_offset: torch.Tensor,
    attn_bias: torch.Tensor | None,
    cum_seq_q: torch.Tensor | None,
    cum_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients from the forward's own [B, H, M, 1] log-sum-exp, laid out as q, k and v
    (meta__scaled_dot_product_cudnn_backward); a K/V head's summed over its group's query heads."""
    _check_cudnn(q, k, v, dropout_p)
    if logsumexp.shape != (*q.shape[:3], 1):
        raise RuntimeError(
            f"cuDNN attention backward: softmax stats of shape {tuple(logsumexp.shape)} for {q.shape[:3]}"
        )
    dq, dk, dv = _grouped_attention_grads(grad_out, q, k, v, out, logsumexp, attn_bias, is_causal, scale)
    return tuple(torch.empty_like(like).copy_(grad) for like, grad in ((q, dq), (k, dk), (v, dv)))


# What of CUDA's row the simulated device can take: its fused AdamW (the CPU's fused kernel on the
# host data), the flash, memory-efficient and cuDNN attention operators for the model's attention
# (where CUDA would pick them among what this profile offers), the memory-efficient one for the
# ring's, and `selective` saving fused attention. Not here: compiled blocks (the simulated device's
# tensors break a captured graph), FlexAttention (compiled only), pinned copies (no pinned allocator).
def _cuda_like_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """scaled_dot_product_attention as sdp_utils.cpp's select_sdp_backend picks it: the first backend
    of torch's priority order that is enabled (torch.nn.attention.sdpa_kernel) and takes the inputs;
    none: "No available kernel", after warning why cuDNN's refused. The flash kernel takes fp16 or
    bf16, no mask, head dim at most 256, grouped-query attention read in place; the memory-efficient
    one as many key as query heads (it has no grouped-query support here); the cuDNN one what
    _cudnn_sdpa_refusal lets through. The order is _priority_order's: cuDNN, flash, memory-efficient,
    math on the profile's H100 (the build's default, ATen/Context.h's flash, memory-efficient, math,
    cuDNN, where TORCH_CUDNN_SDPA_DEPRIORITIZED=1); sdpa_kernel(..., set_priority=True) reorders it
    as on CUDA. Each operator's backward is its own (derivatives.yaml), so recompute policies see
    CUDA's."""
    cudnn_refusal = _cudnn_sdpa_refusal(q, k, v, attn_mask, dropout_p, enable_gqa)
    takes = {
        SDPBackend.FLASH_ATTENTION: torch.backends.cuda.flash_sdp_enabled()
        and attn_mask is None
        and q.dtype in (torch.float16, torch.bfloat16)
        and q.size(-1) <= 256
        and (k.size(1) == q.size(1) or enable_gqa),
        SDPBackend.EFFICIENT_ATTENTION: torch.backends.cuda.mem_efficient_sdp_enabled() and k.size(1) == q.size(1),
        SDPBackend.MATH: torch.backends.cuda.math_sdp_enabled(),
        SDPBackend.CUDNN_ATTENTION: cudnn_refusal is None,
    }
    backend = next((b for b in _priority_order() if takes.get(b)), None)
    if backend is None:
        warnings.warn(f"cuDNN attention kernel not used because: {cudnn_refusal}", stacklevel=2)
        raise RuntimeError("No available kernel. Aborting execution.")
    if backend == SDPBackend.FLASH_ATTENTION:
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, scale=scale)[0]
    if backend == SDPBackend.MATH:
        math_sdpa = torch.ops.aten._scaled_dot_product_attention_math
        return math_sdpa(q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # additive, as attention.cpp converts it
        attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask, -math.inf)
    if backend == SDPBackend.CUDNN_ATTENTION:
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))  # should_compute_logsumexp
        return torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, attn_mask, grad, dropout_p, is_causal, scale=scale
        )[0]
    if attn_mask is not None:  # broadcast and row-aligned, as torch's sdpa prepares it for the kernel
        tk = attn_mask.size(-1)
        attn_mask = F.pad(attn_mask, (0, -tk % _BIAS_ALIGN))[..., :tk].expand(q.size(0), q.size(1), q.size(2), tk)
    out, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, attn_mask, q.requires_grad, dropout_p, is_causal, scale=scale
    )
    return out


CUDA_LIKE = record.DeviceRecord(
    simulated_device.TYPE,
    fused_adamw=True,
    sdpa_backends=record.RECORDS["cuda"].sdpa_backends,  # train.attention_backend: CUDA's choices
    recompute_fused_attention=False,
    ring_kernel="efficient",
    ring_attention=True,
)
_HOST_KERNELS = {
    CUDA_LIKE: {
        "_scaled_dot_product_efficient_attention": _efficient_forward,
        "_scaled_dot_product_efficient_attention_backward": _efficient_backward,
        "_scaled_dot_product_flash_attention": _flash_forward,
        "_scaled_dot_product_flash_attention_backward": _flash_backward,
        "_scaled_dot_product_cudnn_attention": _cudnn_forward,
        "_scaled_dot_product_cudnn_attention_backward": _cudnn_backward,
        "sdpa": _cuda_like_sdpa,
    }
}


@contextlib.contextmanager
def profile(device_record: record.DeviceRecord) -> Iterator[None]:
    """The simulated device, present, under `device_record` and the host kernels behind it. Each
    entry starts as a process does (SDPA's priority order not yet set: _priority_order), and the
    order torch had is restored after."""
    global _priority_set
    simulated_device.register()
    kernels = _HOST_KERNELS.get(device_record, {})
    order, _priority_set = torch._C._get_sdp_priority_order(), False
    try:
        with (
            simulated_device.present(),
            mock.patch.dict(record.RECORDS, {simulated_device.TYPE: device_record}),
            mock.patch.dict(simulated_device.HOST_KERNELS, kernels),
        ):
            yield
    finally:
        torch._C._set_sdp_priority_order(order)


PROFILES = {"cuda-like": CUDA_LIKE, "neuron-like": NEURON_LIKE}  # by the names tests and scenarios use


@contextlib.contextmanager
def counted_kernels(calls: Counter[str]) -> Iterator[None]:
    """Inside a profile: each of its host kernels counts its calls into `calls` while the block runs."""
    kernels = simulated_device.HOST_KERNELS

    def counting(name: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
        return lambda *args, **kwargs: calls.update([name]) or kernel(*args, **kwargs)

    saved = dict(kernels)
    kernels.update({name: counting(name, kernel) for name, kernel in saved.items()})
    try:
        yield
    finally:
        kernels.update(saved)
