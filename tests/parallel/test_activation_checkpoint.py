"""Each recompute policy gives the same loss and gradients as none, and saves what it says."""

import dataclasses
import inspect
import logging

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.model import Llama
from hlat.parallel.activation_checkpoint import apply_activation_checkpoint, checkpoint_block
from hlat.parallel.loss import token_loss_sum
from hlat.parallel.saved_activations import block_bytes
from hlat.precision import autocast, cast_parameters

CFG = ModelConfig(vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=160, max_seq_len=32)


def loss_and_grads(
    policy: str, every_other_mm: bool = False, mode: str = "fp32"
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = cast_parameters(Llama(CFG), mode)
    apply_activation_checkpoint(model, policy, every_other_mm)
    tokens = torch.randint(0, CFG.vocab_size, (2, 33), generator=torch.Generator().manual_seed(1))
    with autocast(mode, torch.device("cpu")):
        loss = token_loss_sum(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    return loss.detach(), {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("policy, every_other_mm", [("selective", False), ("op", False), ("op", True), ("full", False)])
def test_recompute_matches_no_recompute(policy, every_other_mm):
    ref_loss, ref_grads = loss_and_grads("none")
    loss, grads = loss_and_grads(policy, every_other_mm)
    # the same ops replayed on the same inputs: bit-identical (measured)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("policy", ["selective", "op", "full"])
@pytest.mark.parametrize("mode", ["bf16-sr", "mixed"])
def test_recompute_replays_the_precision_casts(policy, mode):
    """Backward recomputes outside the forward's precision context (bf16-sr's fp32 upcast of bf16
    weights, mixed's bf16 weight copies): the recompute must still see the same dtypes."""
    ref_loss, ref_grads = loss_and_grads("none", mode=mode)
    loss, grads = loss_and_grads(policy, mode=mode)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    for name, grad in grads.items():  # bit-identical (measured): the same casts and ops replayed
        assert grad.dtype == ref_grads[name].dtype, name
        torch.testing.assert_close(grad, ref_grads[name], rtol=0, atol=0, msg=name)


def test_policies_order_by_what_they_save():
    saved = [
        block_bytes(CFG, policy, every_other, batch=2, seq=32)
        for policy, every_other in (("none", False), ("selective", False), ("op", False), ("op", True), ("full", False))
    ]
    assert saved == sorted(saved, reverse=True) and len(set(saved)) == 5
    assert saved[-1] == 2 * 32 * CFG.d_model * 4  # full: the block's input alone


def test_every_other_mm_needs_op():
    problems = ParallelConfig(activation_checkpoint="selective", recompute_every_other_mm=True).validate()
    assert [name for name, _ in problems] == ["recompute_every_other_mm"]
    assert "--parallel.activation_checkpoint op" in problems[0][1]
    assert not ParallelConfig(activation_checkpoint="op", recompute_every_other_mm=True).validate()
    ((name, message),) = ParallelConfig(activation_checkpoint="ops").validate()
    assert name == "activation_checkpoint" and "none, selective, op, full" in message


class _Recorded(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", ["fp32", "mixed", "bf16-sr", "bf16"])
@pytest.mark.parametrize("variant", ["gqa", "bias-rope-scaling", "document-masking"])
def test_blocks_hold_no_in_place_op(mode, variant):
    """A compiled recompute region must not mutate (torch says so once per compiled run, and hlat
    drops that line on the strength of this test): every op of the model's forward, blocks
    included, as it runs under each precision mode, is out of place."""
    cfg = (
        CFG
        if variant != "bias-rope-scaling"
        else dataclasses.replace(
            CFG,
            attention_bias=True,
            mlp_bias=True,
            rope_scaling="llama3",
            rope_factor=8.0,
            rope_original_max_seq_len=16,
        )
    )
    model = cast_parameters(Llama(cfg), mode)
    tokens = torch.randint(0, cfg.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    documents = torch.tensor([[0] * 20 + [1] * 12, [0] * 32]) if variant == "document-masking" else None
    positions = torch.cat([torch.arange(20), torch.arange(12)]).expand(2, 32) if documents is not None else None
    recorded = _Recorded()
    with autocast(mode, torch.device("cpu")), recorded:  # the whole forward: its blocks and what surrounds them
        model(tokens, positions, doc_ids=documents)
    assert len(recorded.ops) > 10
    assert not [op for op in recorded.ops if op._schema.is_mutable], mode


def test_the_in_place_reminder_is_dropped_and_nothing_else():
    import torch._higher_order_ops.wrap as wrap

    message = "Detected that context_fn is passed to torch.utils.checkpoint under torch.compile."
    assert message in inspect.getsource(wrap)  # the line torch logs (if torch rewords it, this filter is stale)
    checkpoint_block(torch.nn.Linear(2, 2), "selective", compiled=True)
    logger = logging.getLogger(wrap.__name__)
    record = lambda text: logger.makeRecord(logger.name, logging.WARNING, "wrap.py", 1, text, (), None)
    assert not logger.filter(
        record("\n" + message + "\nPlease make sure the checkpointed region does not contain in-place ops")
    )
    assert logger.filter(record("any other warning"))
