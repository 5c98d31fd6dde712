"""Ring attention against one process's attention, causal or with document masking (a scenario of test_ring_attention.py, see
tests/runs.py): every rank computes the whole sequence's causal attention and its gradients, then
its load-balanced share by ring attention over the cp ranks, and records the largest differences."""

import json

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hlat.model.attention import dense_document_mask
from hlat.model.ring_attention import RingContext, ring_attention
from hlat.parallel.context_parallel import shard_sequence

B, H, T, D = 2, 4, 32, 16


# Document numbers of each row: boundaries inside chunks, on a chunk edge (8 of 32 is the edge
# of cp 2's chunks of 8 and cp 4's of 4), a document over several chunks, and one-token documents.
DOCUMENTS = torch.tensor([[0] * 5 + [1] * 3 + [2] * 17 + [3] + [4] * 6, [0] * 8 + [1] * 8 + [2] + [3] * 15])


def compare(ctx, kv_heads: int, documents: bool = False) -> None:
    """Scenario: attention of H query heads over `kv_heads` K/V heads, on this scenario's ranks;
    `documents`: causal within the documents of DOCUMENTS."""
    compare_on(ctx, kv_heads, documents, torch.device("cpu"))


def compare_on(ctx, kv_heads: int, documents: bool, device: torch.device) -> None:
    """compare, the ring on `device` (the reference on the CPU); the largest differences to errors.rank{r}.json."""
    gen = torch.Generator().manual_seed(3)
    q, grad = (torch.randn(B, H, T, D, generator=gen) for _ in range(2))
    k, v = (torch.randn(B, kv_heads, T, D, generator=gen) for _ in range(2))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    doc_ids = DOCUMENTS if documents else None
    mask = None if doc_ids is None else dense_document_mask(doc_ids)
    reference = F.scaled_dot_product_attention(*full, attn_mask=mask, is_causal=mask is None, enable_gqa=kv_heads != H)
    reference.backward(grad)

    def mine(t: torch.Tensor) -> torch.Tensor:  # [B, H, T, D] -> this rank's chunks along T
        return shard_sequence(t.transpose(1, 2), ctx.rank, ctx.world).transpose(1, 2)

    local = [mine(t).detach().to(device, copy=True).requires_grad_() for t in (q, k, v)]
    ring = RingContext(dist.group.WORLD, ctx.rank, ctx.world, None if doc_ids is None else doc_ids.to(device))
    out = ring_attention(*local, ring)
    out.backward(mine(grad).to(device))
    errors = {
        name: (got.cpu() - mine(want)).abs().max().item()
        for name, got, want in zip(
            ("out", "dq", "dk", "dv"),
            (out, *(t.grad for t in local)),
            (reference, *(t.grad for t in full)),
            strict=True,
        )
    }
    (ctx.out / f"errors.rank{ctx.rank}.json").write_text(json.dumps(errors))
