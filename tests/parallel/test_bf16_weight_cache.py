"""precision.bf16_weight_cache: mixed casts each weight to bf16 once per step instead of once per
micro-batch, with the same gradients; refused where there is nothing it could cache."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hlat.config.layout import Degrees
from hlat.config.load import load_config
from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import Batch
from hlat.errors import ConfigError
from hlat.parallel.mesh import Layout
from hlat.parallel.parallelize import build_parallel_model

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
MICRO_BATCHES = 3


class _Bf16Casts(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") is torch.bfloat16:
            self.counts[tuple(args[0].shape)] += 1
        return func(*args, **kwargs)


def _step(cache: bool, activation_checkpoint: str = "none") -> tuple[int, list[torch.Tensor]]:
    """(bf16 casts of weight-shaped tensors in one step of MICRO_BATCHES micro-batches, the gradients)."""
    precision = PrecisionConfig(mode="mixed", bf16_weight_cache=cache)
    par = ParallelConfig(activation_checkpoint=activation_checkpoint)
    model = build_parallel_model(
        CFG,
        parallel=par,
        layout=Layout(1, 0, Degrees(), None),
        device=torch.device("cpu"),
        seed=0,
        n_microbatches=MICRO_BATCHES,
        precision=precision,
    )
    tokens = torch.randint(0, CFG.vocab_size, (MICRO_BATCHES, 17), generator=torch.Generator().manual_seed(0))
    batches = [Batch(tokens[i : i + 1, :-1], tokens[i : i + 1, 1:]) for i in range(MICRO_BATCHES)]
    shapes = {tuple(p.shape) for p in model.parameters()}
    with _Bf16Casts() as casts:
        model.forward_backward(batches, torch.tensor(48.0))
    assert model.bf16_cache is None or not model.bf16_cache  # dropped before the optimizer step
    return sum(n for shape, n in casts.counts.items() if shape in shapes), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("activation_checkpoint", ["none", "selective"])
def test_one_cast_per_weight_and_step_with_the_same_gradients(activation_checkpoint: str):
    n_params = len(
        list(
            build_parallel_model(
                CFG,
                parallel=ParallelConfig(),
                layout=Layout(1, 0, Degrees(), None),
                device=torch.device("cpu"),
                seed=0,
                n_microbatches=1,
                precision=PrecisionConfig(mode="mixed"),
            ).parameters()
        )
    )
    cached, cached_grads = _step(True, activation_checkpoint)
    per_use, grads = _step(False, activation_checkpoint)
    assert cached == n_params
    assert per_use >= MICRO_BATCHES * n_params
    for a, b in zip(cached_grads, grads):
        assert a.dtype == torch.float32 and torch.equal(a, b)


def test_refused_where_it_caches_nothing():
    with pytest.raises(
        ConfigError, match=r"precision\.bf16_weight_cache: caches mixed's bf16 weight copies; precision\.mode fp32"
    ):
        load_config("tiny", overrides=["--precision.bf16_weight_cache", "true"])
    with pytest.raises(
        ConfigError, match=r"precision\.bf16_weight_cache: FSDP2 \(zero2\) casts the weights as it gathers"
    ):
        load_config(
            "tiny",
            overrides=[
                "--precision.mode",
                "mixed",
                "--precision.bf16_weight_cache",
                "true",
                "--parallel.dp_sharding",
                "zero2",
            ],
            world=2,
        )
