"""Ring attention: causal attention over a sequence split across the context-parallel ranks.

Causal load balancing: the sequence is cut into 2*cp chunks and cp rank r holds chunks r and
2*cp-1-r (an early and a late one), so every rank does the same causal attention work. Ring
attention: each rank keeps its queries and passes its keys/values around the cp ring (P2P to the
next rank, from the previous one); at every step it attends its two query chunks to the two K/V
chunks it holds, skipping the pairs that causality masks out entirely, and merges the partial
outputs by their log-sum-exp. The backward pass sends the K/V around again, with their gradients
accumulating beside them until they arrive back at the rank that owns them.

Each chunk pair runs a fused attention operator that returns the log-sum-exp and whose backward
accepts the merged output and log-sum-exp: the device record's `ring_kernel` names it (torch's CPU
flash attention on the CPU, the memory-efficient kernel on CUDA, which also takes the document
mask as a bias and runs in fp32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.distributed_c10d import _resolve_process_group

from hlat.device.record import device_record


@dataclass(frozen=True, eq=False)
class RingContext:
    """What the attention needs to run as ring attention; passed as the model's attn_mask."""

    group: dist.ProcessGroup
    rank: int  # this rank's coordinate on the cp dim
    size: int  # cp
    # With document masking: the whole rows' document numbers [B, T] (every cp rank has them), so
    # each rank builds any chunk pair's mask itself and no document ids travel the ring.
    doc_ids: torch.Tensor | None = None


def chunk_ids(rank: int, cp: int) -> tuple[int, int]:
    """The two load-balanced chunks (of 2*cp) that cp rank `rank` holds, in order."""
    return rank, 2 * cp - 1 - rank


Pair = tuple[int, int, bool, torch.Tensor | None]


def _pairs(ring: RingContext, kv_rank: int) -> list[Pair]:
    """(query chunk slot, K/V chunk slot, causal, additive mask or None) for the chunk pairs that
    attend at all: a query chunk attends fully to earlier chunks, causally to itself, not at all to
    later ones; under document masking only within a document, pairs sharing none skipped."""
    out: list[Pair] = []
    for qi, qc in enumerate(chunk_ids(ring.rank, ring.size)):
        for ki, kc in enumerate(chunk_ids(kv_rank, ring.size)):
            if qc < kc:
                continue
            if ring.doc_ids is None:
                out.append((qi, ki, qc == kc, None))
                continue
            docs = ring.doc_ids.chunk(2 * ring.size, dim=1)
            allowed = (docs[qc][:, :, None] == docs[kc][:, None, :])[:, None]  # [B, 1, chunk, chunk]
            if qc == kc:
                allowed = allowed & torch.ones(allowed.shape[-2:], dtype=torch.bool, device=allowed.device).tril()
            if allowed.any():
                out.append((qi, ki, False, allowed))
    return out


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # the kernels take a float mask of the query's dtype
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, float("-inf"))


# One chunk pair's attention: (out, fp32 log-sum-exp [B, H, Tq]) forward; (dq, dk, dv) backward from
# the merged output and log-sum-exp. Keyed by DeviceRecord.ring_kernel.
_MEM_EFF_BIAS_ALIGN, _MEM_EFF_LSE_ALIGN = 16, 32  # the CUDA kernel's bias row stride and lse padding


def _mem_eff_bias(allowed: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """The document mask as the memory-efficient kernel takes it: [B, H, Tq, Tk] of q's dtype, rows
    strided to a multiple of 16 (torch's own sdpa pads the same way before calling it)."""
    if allowed is None:
        return None
    tk = allowed.size(-1)
    padded = F.pad(_additive(allowed, q.dtype), (0, -tk % _MEM_EFF_BIAS_ALIGN))[..., :tk]
    return padded.expand(q.size(0), q.size(1), q.size(2), tk)


def _pair_forward(
    kernel: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    allowed: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    if kernel == "flash_cpu":
        mask = None if allowed is None else _additive(allowed, q.dtype)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=mask, scale=scale
        )
    out, lse, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, _mem_eff_bias(allowed, q, k), True, 0.0, causal, scale=scale
    )
    return out, lse[..., : q.size(2)]  # the lse comes padded to a multiple of 32 queries


def _pair_backward(
    kernel: str,
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    allowed: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if kernel == "flash_cpu":
        mask = None if allowed is None else _additive(allowed, q.dtype)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, k, v, out, lse, 0.0, causal, attn_mask=mask, scale=scale
        )
    no_dropout = torch.empty((), dtype=torch.long)  # the philox seed and offset, unread at dropout 0
    dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        grad, q, k, v, _mem_eff_bias(allowed, q, k), out, F.pad(lse, (0, -lse.size(-1) % _MEM_EFF_LSE_ALIGN)),
        no_dropout, no_dropout, 0.0, [True, True, True, False], causal, scale=scale,
    )  # fmt: skip
    return dq, dk, dv


def _kernel(device: torch.device) -> str:
    kernel = device_record(device.type).ring_kernel
    if kernel is None:
        raise RuntimeError(f"ring attention has no kernel on {device.type} (hlat.device.record's ring_kernel)")
    return kernel


def _shift(t: torch.Tensor, ctx: RingContext) -> torch.Tensor:
    """Send `t` to the next cp rank and return what the previous one sent (itself on a ring of one)."""
    if ctx.size == 1:
        return t
    received = torch.empty_like(t)
    nxt = dist.get_global_rank(ctx.group, (ctx.rank + 1) % ctx.size)
    prev = dist.get_global_rank(ctx.group, (ctx.rank - 1) % ctx.size)
    ops = [dist.P2POp(dist.isend, t, nxt, ctx.group), dist.P2POp(dist.irecv, received, prev, ctx.group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return received


def _per_query_head(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query K/V [B, Hkv, T, D] repeated to `heads` (the kernel wants one per query head).
    Inside the ring, not before it: the ring passes, and saves for backward, Hkv heads only."""
    return t if t.size(1) == heads else t.repeat_interleave(heads // t.size(1), dim=1)


def _per_kv_head(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The gradient of repeated K/V summed back onto the Hkv heads they were repeated from."""
    return grad if grad.size(1) == kv_heads else grad.unflatten(1, (kv_heads, -1)).sum(2)


def _halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = t.chunk(2, dim=2)
    return a.contiguous(), b.contiguous()


def _merge(out: torch.Tensor, lse: torch.Tensor, o: torch.Tensor, lse_o: torch.Tensor) -> None:
    """out, lse (fp32, in place) <- the softmax-weighted merge of two partial attentions. Every
    query attends to itself in its diagonal pair, so the merged log-sum-exp ends finite; before
    that, a row no key was allowed for so far has -inf, weighted 0 (not exp(-inf - -inf) = NaN)."""
    new = torch.logaddexp(lse, lse_o)
    finite = new.masked_fill(new == float("-inf"), 0.0)
    out.mul_(torch.exp(lse - finite)[..., None]).add_(o.float() * torch.exp(lse_o - finite)[..., None])
    lse.copy_(new)


# Ring attention is one operator (hlat::ring_attention) and its backward another, so that what
# sees operators sees it whole: a recompute policy saves its output (hlat.parallel.
# activation_checkpoint) rather than caching, and replaying, the ring's in-place merges and sends.
# The cp group travels by name (an operator's arguments are tensors and plain values).


def _ring(group_name: str, rank: int, size: int, doc_ids: torch.Tensor | None) -> RingContext:
    return RingContext(_resolve_process_group(group_name), rank, size, doc_ids)


@torch.library.custom_op("hlat::ring_attention", mutates_args=())
def _ring_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    doc_ids: torch.Tensor | None,
    group_name: str,
    rank: int,
    size: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, fp32 log-sum-exp [B, H, T/cp]) of this rank's queries over the ring's K/V."""
    ring, kernel = _ring(group_name, rank, size, doc_ids), _kernel(q.device)
    qs = _halves(q)
    outs = [torch.zeros(h.shape, dtype=torch.float32, device=q.device) for h in qs]
    lses = [torch.full(h.shape[:-1], float("-inf"), device=q.device) for h in qs]
    kv = torch.stack([k, v])
    for step in range(ring.size):
        src = (ring.rank - step) % ring.size
        ks, vs = (_halves(_per_query_head(t, q.size(1))) for t in kv)
        for qi, ki, causal, allowed in _pairs(ring, src):
            o, lse = _pair_forward(kernel, qs[qi], ks[ki], vs[ki], causal, allowed, scale)
            if allowed is not None:  # a row with no key allowed: weight 0 whatever the kernel returned
                empty = ~allowed.any(-1)
                o, lse = o.masked_fill(empty[..., None], 0.0), lse.masked_fill(empty, float("-inf"))
            _merge(outs[qi], lses[qi], o, lse)
        if step < ring.size - 1:
            kv = _shift(kv, ring)
    # laid out [B, T, H, D] in memory as the flash kernel's output is: the model's reshape of it
    # for wo is then a view, not a second copy that wo keeps for backward
    out = torch.cat(outs, dim=2).to(q.dtype).transpose(1, 2).contiguous().transpose(1, 2)
    return out, torch.cat(lses, dim=2)


# The fake implementations give the real outputs' strides, not their inputs' (empty_like would):
# a compiled graph views the outputs by the strides its fakes had, and a view fails on other ones.
@_ring_forward.register_fake
def _(q, k, v, doc_ids, group_name, rank, size, scale):  # type: ignore[no-untyped-def]
    b, h, t, d = q.shape
    return q.new_empty(b, t, h, d).transpose(1, 2), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("hlat::ring_attention_backward", mutates_args=())
def _ring_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    doc_ids: torch.Tensor | None,
    group_name: str,
    rank: int,
    size: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv): the K/V pass around the ring again, their gradients travelling beside them."""
    ring, kernel = _ring(group_name, rank, size, doc_ids), _kernel(q.device)
    qs, outs, lses, grads = _halves(q), _halves(out), _halves(lse[..., None]), _halves(grad_out)
    dq = [torch.zeros(h.shape, dtype=torch.float32, device=q.device) for h in qs]
    kv = torch.stack([k, v])
    dkv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)  # travels with the K/V it belongs to
    for step in range(ring.size):
        src = (ring.rank - step) % ring.size
        ks, vs = (_halves(_per_query_head(t, q.size(1))) for t in kv)
        dk, dv = dkv[0].chunk(2, dim=2), dkv[1].chunk(2, dim=2)
        for qi, ki, causal, allowed in _pairs(ring, src):
            gq, gk, gv = _pair_backward(
                kernel, grads[qi], qs[qi], ks[ki], vs[ki], outs[qi], lses[qi][..., 0], causal, allowed, scale
            )
            dq[qi] += gq
            dk[ki].add_(_per_kv_head(gk, k.size(1)))
            dv[ki].add_(_per_kv_head(gv, v.size(1)))
        if step < ring.size - 1:
            kv = _shift(kv, ring)
        dkv = _shift(dkv, ring)  # after cp shifts each rank holds its own K/V's gradient
    # copies: an operator's outputs may not share storage (dkv[0] and dkv[1] do)
    return torch.cat(dq, dim=2).to(q.dtype), dkv[0].to(k.dtype, copy=True), dkv[1].to(v.dtype, copy=True)


@_ring_backward.register_fake
def _(grad_out, q, k, v, out, lse, doc_ids, group_name, rank, size, scale):  # type: ignore[no-untyped-def]
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)  # contiguous, as returned


def _setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    q, k, v, doc_ids, *ring = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.doc_ids, ctx.ring = doc_ids, ring


def _backward(ctx, grad_out: torch.Tensor, _grad_lse: torch.Tensor):  # type: ignore[no-untyped-def]
    # the log-sum-exp is internal (ring_attention returns only the output): its gradient is unused
    dq, dk, dv = _ring_backward(grad_out.contiguous(), *ctx.saved_tensors, ctx.doc_ids, *ctx.ring)
    return dq, dk, dv, None, None, None, None, None


_ring_forward.register_autograd(_backward, setup_context=_setup_context)

RING_ATTENTION = torch.ops.hlat.ring_attention.default  # what a recompute policy sees


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: RingContext) -> torch.Tensor:
    """Causal attention (within documents, given ring.doc_ids) of this rank's load-balanced
    queries [B, H, T/cp, D] over the whole sequence's keys and values, held [B, Hkv, T/cp, D] on
    each cp rank."""
    out, _ = _ring_forward(q, k, v, ring.doc_ids, ring.group.group_name, ring.rank, ring.size, q.size(-1) ** -0.5)
    return out
