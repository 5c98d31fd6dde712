"""The planner under context parallelism: a cp rank's activations against what hlat's ring
attention keeps (measured on the CPU under a fake process group: the bytes do not depend on the
values the ring receives), state sharded over dp x cp, ring traffic in the step, cp in --search."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torch.distributed as dist

from hlat.config.load import load_config
from hlat.config.run import RunConfig
from hlat.model import build_model
from hlat.model.ring_attention import RingContext
from hlat.parallel.activation_checkpoint import apply_activation_checkpoint
from hlat.parallel.context_parallel import shard_sequence
from hlat.parallel.saved_activations import bytes_saved_for_backward
from hlat.planning.memory import activation_bytes_per_layer

SEQ = 64


@functools.cache
def _tiny(*extra: str) -> RunConfig:
    # grouped-query K/V (4 heads over 2), so the ring's repetition of K/V shows
    args = ["--model.n_heads", "4", "--model.n_kv_heads", "2", "--model.d_model", "64", "--model.ffn_dim", "128"]
    return load_config("tiny", None, [*args, "--data.seq_len", str(SEQ), "--precision.mode", "fp32", *extra])


def _ring_block_bytes(cfg: RunConfig, policy: str, cp: int) -> int:
    """Bytes one block keeps for backward on cp rank 0 of `cp`, its ring over a fake group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    one = build_model(dataclasses.replace(cfg.model, n_layers=1, max_seq_len=SEQ))
    apply_activation_checkpoint(one, policy, False)
    positions = shard_sequence(torch.arange(SEQ)[None], 0, cp)[0]
    cos, sin = one.rope_cos[None, positions, None], one.rope_sin[None, positions, None]
    x = torch.randn(1, SEQ // cp, cfg.model.d_model, requires_grad=True)
    dist.init_process_group("fake", rank=0, world_size=cp, store=FakeStore())
    try:
        ring = RingContext(dist.group.WORLD, 0, cp)
        return bytes_saved_for_backward(lambda: one.layers["0"](x.clone(), cos, sin, ring))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("policy", ["none", "op", "full"])
@pytest.mark.parametrize("cp", [2, 4])
def test_a_cp_ranks_activations_are_what_the_ring_keeps(policy: str, cp: int) -> None:
    cfg = _tiny("--train.micro_batch", "1", "--parallel.activation_checkpoint", policy)
    measured = _ring_block_bytes(cfg, policy, cp)
    planned = activation_bytes_per_layer(cfg, tp=1, cp=cp)
    # the plan leaves out the norms' per-token rsqrt (2 elements of ~1,200 per token)
    assert planned == pytest.approx(measured, rel=0.005)
    # and a cp rank holds less than one rank of the whole sequence
    assert planned < activation_bytes_per_layer(cfg, tp=1)
