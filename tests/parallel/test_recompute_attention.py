"""Every recompute policy x attention path x precision mode trains like no recompute.

The policies see each op of a block, and the attention paths reach them as different ops: SDPA's
fused kernels (causal), SDPA with a dense document mask (the CPU's document masking) and the
FlexAttention higher-order operator (CUDA's document masking), which once crashed `selective`
(a policy read `is_view` off an operator that is no OpOverload). Forward and backward of a tiny
model under each combination give the loss and gradients of the same run without recompute.
"""

from collections import Counter

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

from hlat.config.model import ModelConfig
from hlat.model import Llama
from hlat.model.attention import dense_document_mask, flex_document_mask
from hlat.parallel import activation_checkpoint as ac
from hlat.parallel.compile import compile_blocks
from hlat.parallel.loss import token_loss_sum
from hlat.precision import autocast, cast_parameters

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
POLICIES = [("selective", False), ("op", False), ("op", True), ("full", False)]
MODES = ["fp32", "mixed", "bf16-sr"]
# Against no recompute: the recompute replays the same ops on the same inputs in every mode, so
# loss and gradients are bit-identical (measured: every path, policy and mode here, compiled too).
EXACT = (0.0, 0.0)


def _mask(path: str):  # type: ignore[no-untyped-def]
    documents = torch.tensor([[0] * 20 + [1] * 12, [0] * 7 + [1] * 25])
    return {"sdpa": None, "dense": dense_document_mask(documents), "flex": flex_document_mask(documents)}[path]


def loss_and_grads(path: str, mode: str, policy: str = "none", every_other_mm: bool = False, compiled: bool = False):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = cast_parameters(Llama(CFG), mode)
    ac.apply_activation_checkpoint(model, policy, every_other_mm, compiled)
    if compiled:  # the policy then runs while AOTAutograd traces the block (aot_eager: no inductor needed)
        compile_blocks(model, "cpu", backend="aot_eager")
    tokens = torch.randint(0, CFG.vocab_size, (2, 33), generator=torch.Generator().manual_seed(1))
    with autocast(mode, torch.device("cpu")):
        loss = token_loss_sum(model(tokens[:, :-1], attn_mask=_mask(path)), tokens[:, 1:])
    loss.backward()
    return loss.detach(), {
        n.replace("_orig_mod.", "").replace("_checkpoint_wrapped_module.", ""): p.grad
        for n, p in model.named_parameters()
    }


def _assert_same(run, reference, tolerance: tuple[float, float] = EXACT) -> None:  # type: ignore[no-untyped-def]
    rtol, atol = tolerance
    torch.testing.assert_close(run[0], reference[0], rtol=rtol, atol=atol)
    assert run[1].keys() == reference[1].keys()
    for name, grad in run[1].items():
        assert grad.dtype == reference[1][name].dtype, name
        torch.testing.assert_close(grad, reference[1][name], rtol=rtol, atol=atol, msg=name)


def _audit(path: str, mode: str) -> None:
    reference = loss_and_grads(path, mode)
    for policy, every_other_mm in POLICIES:
        _assert_same(loss_and_grads(path, mode, policy, every_other_mm), reference)


# The causal SDPA path ("sdpa") under every policy and mode: tests/parallel/test_activation_checkpoint.py.
@pytest.mark.parametrize("mode", MODES)
def test_recompute_under_the_dense_document_mask(mode: str) -> None:
    _audit("dense", mode)


@pytest.mark.parametrize("mode", MODES)
def test_recompute_under_flex_attention(mode: str, flex_on_cpu: None) -> None:
    _audit("flex", mode)


@pytest.mark.parametrize("policy", ["selective", "op"])
def test_compiled_recompute_under_flex_attention(policy: str, flex_on_cpu: None) -> None:
    _assert_same(loss_and_grads("flex", "fp32", policy, compiled=True), loss_and_grads("flex", "fp32"))


def test_flex_attention_trains_like_the_dense_mask(flex_on_cpu: None) -> None:
    """The reference above is itself right: FlexAttention's loss and gradients are the dense mask's
    (to fp32 rounding: the two sum the scores in different orders)."""
    _assert_same(loss_and_grads("flex", "fp32"), loss_and_grads("dense", "fp32"), (1e-4, 1e-6))


def test_policies_place_flex_attention_with_the_fused_kernels() -> None:
    """selective recomputes core attention, op saves fused attention's output: FlexAttention included."""
    flex = torch.ops.higher_order.flex_attention
    ctx = SelectiveCheckpointContext(is_recompute=False)
    assert ac._selective_policy(True, ctx, flex) == CheckpointPolicy.PREFER_RECOMPUTE
    assert ac._selective_policy(False, ctx, flex) == CheckpointPolicy.MUST_SAVE
    assert ac._op_policy(False, Counter(), ctx, flex) == CheckpointPolicy.MUST_SAVE
