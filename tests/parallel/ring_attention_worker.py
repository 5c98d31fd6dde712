"""Ring attention against one process's attention (a scenario of test_ring_attention.py, see
tests/runs.py): every rank computes the whole sequence's causal attention and its gradients, then
its load-balanced share by ring attention over the cp ranks, and records the largest differences."""

import json

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hlat.model.ring_attention import RingContext, ring_attention
from hlat.parallel.context_parallel import shard_sequence

B, H, T, D = 2, 4, 32, 16


def compare(ctx, kv_heads: int) -> None:
    """Scenario: attention of H query heads over `kv_heads` K/V heads, on this scenario's ranks."""
    gen = torch.Generator().manual_seed(3)
    q, grad = (torch.randn(B, H, T, D, generator=gen) for _ in range(2))
    k, v = (torch.randn(B, kv_heads, T, D, generator=gen) for _ in range(2))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = F.scaled_dot_product_attention(*full, is_causal=True, enable_gqa=kv_heads != H)
    reference.backward(grad)

    def mine(t: torch.Tensor) -> torch.Tensor:  # [B, H, T, D] -> this rank's chunks along T
        return shard_sequence(t.transpose(1, 2), ctx.rank, ctx.world).transpose(1, 2)

    local = [mine(t).detach().clone().requires_grad_() for t in (q, k, v)]
    out = ring_attention(*local, RingContext(dist.group.WORLD, ctx.rank, ctx.world))
    out.backward(mine(grad))
    errors = {
        name: (got - mine(want)).abs().max().item()
        for name, got, want in zip(
            ("out", "dq", "dk", "dv"),
            (out, *(t.grad for t in local)),
            (reference, *(t.grad for t in full)),
            strict=True,
        )
    }
    (ctx.out / f"errors.rank{ctx.rank}.json").write_text(json.dumps(errors))
