"""Core attention: SDPA with native grouped-query attention, and the document-masking backends.

Document masking (attention causal and inside each document) has two representations, chosen once
by the device the batch lives on (`document_mask`, from the device's record in hlat.device.record):
- where FlexAttention's compiled kernel exists (CUDA): a BlockMask built from the document ids.
  Only the blocks that hold allowed pairs are computed and no [T, T] tensor exists.
- elsewhere: the dense bool mask [B, 1, T, T] through SDPA. torch 2.13's FlexAttention has no
  backward on CPU, and benchmarks/attention_masking.md measured the dense mask against a
  per-document block-diagonal loop on CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from hlat.device.record import device_record
from hlat.errors import ConfigError
from hlat.model.ring_attention import RingContext, ring_attention

# What the model accepts as a mask: None (causal), a dense bool mask, a BlockMask, or a RingContext
# (causal over a sequence split across the context-parallel ranks).
AttentionMask = torch.Tensor | BlockMask | RingContext | None


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    """softmax(QK^T/sqrt(d)) V on [B, H, T, D]; k/v may have fewer heads (a divisor of q's:
    kv head j serves q heads j*n_rep .. (j+1)*n_rep-1). A bool mask replaces causality."""
    # enable_gqa (torch >= 2.5; hlat needs 2.6): the kernels read K/V heads in place instead of
    # copies repeated n_heads/n_kv_heads times. From shapes: right for tensor-parallel local heads.
    if isinstance(mask, RingContext):
        return ring_attention(q, k, v, mask)
    gqa = k.size(1) != q.size(1)
    if isinstance(mask, BlockMask):
        return _compiled_flex()(q, k, v, block_mask=mask, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa)


@lru_cache(maxsize=1)
def _compiled_flex() -> Callable[..., torch.Tensor]:
    # Eager flex_attention materialises the scores (a reference implementation); compiled, it is
    # a fused kernel that skips the masked-out blocks. Inside a compiled block this is inlined.
    return torch.compile(flex_attention)


# train.attention_backend's choices (but "auto": torch's own pick among the device's kernels)
SDPA_BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def check_attention_backend(name: str, device: torch.device) -> None:
    """Refuse train.attention_backend `name` where `device` does not offer that SDPA backend."""
    offered = device_record(device.type).sdpa_backends
    if name != "auto" and name not in offered:
        choices = ", ".join(("auto", *offered))
        raise ConfigError(
            [("train.attention_backend", f"got {name!r}, which {device.type} does not offer; choose one of {choices}")]
        )


def attention_backend(name: str) -> contextlib.AbstractContextManager:
    """The context SDPA runs in for train.attention_backend `name`; enter it around forward and
    backward (the backward kernel is the forward's) and around the first call of a compiled block
    (the compiler picks the kernel when it traces)."""
    return contextlib.nullcontext() if name == "auto" else sdpa_kernel([SDPA_BACKENDS[name]])


def dense_document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """Block-causal bool mask [B, 1, T, T] (True = may attend): causal and same document."""
    T = doc_ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
    return ((doc_ids[:, :, None] == doc_ids[:, None, :]) & causal)[:, None]


def flex_document_mask(doc_ids: torch.Tensor, compiled: bool = False) -> BlockMask:
    """The same mask as a FlexAttention BlockMask over [B, any head, T, T]. `compiled` builds it
    with a compiled kernel instead of evaluating every (q, kv) pair eagerly ([B, T, T] at once)."""

    def causal_same_document(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (q >= kv) & (doc_ids[b, q] == doc_ids[b, kv])

    B, T = doc_ids.shape
    return create_block_mask(causal_same_document, B, None, T, T, device=doc_ids.device, _compile=compiled)


def document_mask(doc_ids: torch.Tensor | None) -> AttentionMask:
    """The mask for a batch's document ids [B, T] on their device; None without masking."""
    if doc_ids is None:
        return None
    if device_record(doc_ids.device.type).flex_attention:
        return flex_document_mask(doc_ids, compiled=True)
    return dense_document_mask(doc_ids)
