import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from hlat.config.model import ModelConfig
from hlat.model import Llama, attention
from hlat.model.attention import dense_document_mask, document_mask, flex_document_mask, sdpa

B, H, KV, T, D = 2, 8, 2, 40, 16


def qkv(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, T, D, generator=gen, requires_grad=True),
        torch.randn(B, KV, T, D, generator=gen, requires_grad=True),
        torch.randn(B, KV, T, D, generator=gen, requires_grad=True),
    )


def doc_ids() -> torch.Tensor:
    # row 0: documents of 7, 20 and 13 tokens; row 1: one document of 40
    return torch.stack(
        [torch.repeat_interleave(torch.arange(3), torch.tensor([7, 20, 13])), torch.zeros(T, dtype=torch.long)]
    )


def repeated(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    n = q.size(1) // k.size(1)
    return F.scaled_dot_product_attention(
        q, k.repeat_interleave(n, 1), v.repeat_interleave(n, 1), attn_mask=mask, is_causal=mask is None
    )


@pytest.mark.parametrize("masked", [False, True])
def test_gqa_equals_repeated_heads(masked: bool) -> None:
    """Native GQA = K/V heads copied, outputs and gradients."""
    mask = dense_document_mask(doc_ids()) if masked else None
    q, k, v = qkv()
    out = sdpa(q, k, v, mask)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = repeated(q, k, v, mask)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


def test_native_gqa_copies_no_heads() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        seen: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.seen.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    q, k, v = qkv()
    mask = dense_document_mask(doc_ids())
    with Ops() as ops:
        sdpa(q, k, v, mask).sum().backward()
    assert not any("repeat" in op for op in ops.seen), ops.seen


def test_flex_equals_dense_mask(monkeypatch: pytest.MonkeyPatch, compiling: None) -> None:
    """The BlockMask (the CUDA path) and the dense mask (elsewhere) are one mask: same forward.
    On CPU through eager flex_attention (no grad: torch 2.13 has no CPU flex backward), which
    traces itself with dynamo's eager backend, so dynamo is on here; inductor is not needed."""
    monkeypatch.setattr(attention, "_compiled_flex", lambda: flex_attention)
    ids = doc_ids()
    block = flex_document_mask(ids)
    assert isinstance(block, BlockMask)
    q, k, v = (t.detach() for t in qkv(1))
    with torch.no_grad():
        flex = sdpa(q, k, v, block)
        dense = sdpa(q, k, v, dense_document_mask(ids))
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=1e-5)


def test_document_mask_by_device() -> None:
    ids = doc_ids()
    mask = document_mask(ids)
    assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.shape == (B, 1, T, T)
    assert mask[0, 0, 7, 6].item() is False and mask[0, 0, 8, 7].item() is True and not mask[1, 0, 0, 1]
    assert document_mask(None) is None


def test_model_builds_the_mask_from_document_ids() -> None:
    """doc_ids (how pipeline stages get the mask) = the same mask passed in."""
    torch.manual_seed(0)
    model = Llama(
        ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=T)
    )
    x = torch.randint(0, 50, (B, T))
    torch.testing.assert_close(
        model(x, doc_ids=doc_ids()), model(x, attn_mask=document_mask(doc_ids())), rtol=0, atol=0
    )
    with pytest.raises(ValueError, match="not both"):
        model(x, attn_mask=document_mask(doc_ids()), doc_ids=doc_ids())
