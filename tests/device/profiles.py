"""Device profiles for the simulated accelerator: what a real backend offers and refuses, as a
device record plus the behaviour behind it, so the wiring hlat chooses for that backend runs in
the suite against the backend's contract rather than the CPU's.

CUDA_LIKE offers CUDA's flash attention operator for the model's attention in fp16 and bf16
(flash_api.h's contract: those dtypes, head dimensions up to 256, grouped K/V heads read in place,
a log-sum-exp of [B, H, M] floats), and its memory-efficient attention operator, the one context
parallelism's ring
calls per chunk pair there (DeviceRecord.ring_kernel "efficient"), computed on the host with
the CUDA kernel's conventions (aten/src/ATen/native/transformers/cuda/mem_eff_attention,
kernel_forward.h and kernel_backward.h, as shipped in torch 2.13's headers): the output laid out
[B, M, H, D] in memory; a log-sum-exp of [B, H, ceil(M / 32) * 32] floats, its padding +inf; a
fully masked row's output 0 and log-sum-exp 0; the bias of the query's dtype with its batch,
head and row strides multiples of 16 elements ("attn_bias is not correctly aligned"); the same
number of query and key heads; a backward that reads the log-sum-exp in whole 32-query blocks.

NEURON_LIKE follows TorchNeuron (awsdocs-neuron, "torch.compile backend reference", 2026-10-14):
its compile backend rejects dynamic=True ("dynamic=True is rejected during compilation ...
recompiling per new shape"), and it has no fused AdamW kernel. The backend here refuses any graph
with a symbolic size or scalar and otherwise runs the captured graph as it is (the host kernels
behind the simulated device), so numerics stay the CPU's.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch._dynamo import register_backend
from torch.fx.experimental.symbolic_shapes import free_symbols

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
    s = _scores(q, _grouped(k, q.size(1)), None, is_causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    out = (torch.exp(s - lse[..., None]) @ _grouped(v, q.size(1)).float()).to(q.dtype)
    out = out.transpose(1, 2).contiguous().transpose(1, 2)
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
    heads, groups = q.size(1), q.size(1) // k.size(1)
    kk, vv = _grouped(k, heads).float(), _grouped(v, heads).float()
    softmax_scale = q.size(-1) ** -0.5 if scale is None else scale
    p = torch.exp(_scores(q, kk, None, is_causal, scale) - logsumexp[..., None].float())
    g = grad_out.float()
    dv = p.transpose(-1, -2) @ g
    ds = p * (g @ vv.transpose(-1, -2) - (g * out.float()).sum(-1, keepdim=True))
    dq, dk = (ds @ kk) * softmax_scale, (ds.transpose(-1, -2) @ q.float()) * softmax_scale
    b, _, n, d = dk.shape
    dk, dv = (t.view(b, k.size(1), groups, n, d).sum(2) for t in (dk, dv))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# What of CUDA's row the simulated device can take: its fused AdamW (the CPU's fused kernel on the
# host data), the flash and memory-efficient attention operators for the model's attention (where
# CUDA would pick them among what this profile offers), the memory-efficient one for the ring's, and
# `selective` saving fused attention. Not here: compiled blocks (the simulated device's tensors
# break a captured graph), FlexAttention (compiled only), pinned copies (no pinned allocator), the
# cuDNN kernel.
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
    """scaled_dot_product_attention as CUDA picks it for what this profile offers, in CUDA's order:
    the flash kernel where it takes the inputs (fp16 or bf16, no mask, head dim at most 256,
    grouped-query attention read in place), the memory-efficient one where it does (as many key as
    query heads: it has no grouped-query support), else the math path; each as
    torch.nn.attention.sdpa_kernel allows. Its backward is the operator's own (derivatives.yaml),
    so recompute policies see CUDA's operator."""
    flash = (
        torch.backends.cuda.flash_sdp_enabled()
        and attn_mask is None
        and q.dtype in (torch.float16, torch.bfloat16)
        and q.size(-1) <= 256
        and (k.size(1) == q.size(1) or enable_gqa)
    )
    if flash:
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, scale=scale)[0]
    if k.size(1) != q.size(1) or not torch.backends.cuda.mem_efficient_sdp_enabled():
        math = torch.ops.aten._scaled_dot_product_attention_math
        return math(q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask, -math.inf)
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
        "sdpa": _cuda_like_sdpa,
    }
}


@contextlib.contextmanager
def profile(device_record: record.DeviceRecord) -> Iterator[None]:
    """The simulated device, present, under `device_record` and the host kernels behind it."""
    simulated_device.register()
    kernels = _HOST_KERNELS.get(device_record, {})
    with (
        simulated_device.present(),
        mock.patch.dict(record.RECORDS, {simulated_device.TYPE: device_record}),
        mock.patch.dict(simulated_device.HOST_KERNELS, kernels),
    ):
        yield


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
