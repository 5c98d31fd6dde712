"""train.attention_backend and parallel.recompute_attention reach the attention of a training step:
the SDPA kernel a step runs is the one chosen, and `selective` replays fused attention in backward
or reads its saved output, as set; wrong values are refused naming the field."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import hlat.train.trainer as trainer_module
from hlat.config.layout import Degrees
from hlat.config.load import load_config
from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import Batch
from hlat.errors import ConfigError
from hlat.parallel.activation_checkpoint import attention_recomputed
from hlat.parallel.mesh import Layout
from hlat.parallel.parallelize import build_parallel_model

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
CPU = torch.device("cpu")
FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
MATH = torch.ops.aten._safe_softmax.default  # the math backend decomposes; its softmax, once per block


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.counts[func] += 1
        return func(*args, **(kwargs or {}))


def _step_ops(par: ParallelConfig, attention: str = "auto") -> Counter:
    """The aten ops one forward and backward of a tiny model runs."""
    model = build_parallel_model(
        CFG,
        parallel=par,
        layout=Layout(1, 0, Degrees(), None),
        device=CPU,
        seed=0,
        n_microbatches=1,
        precision=PrecisionConfig(mode="fp32"),
        attention=attention,
    )
    tokens = torch.randint(0, CFG.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    batch = Batch(tokens[:, :-1], tokens[:, 1:])
    with _Ops() as ops:
        model.forward_backward([batch], torch.tensor(32.0))
    return ops.counts


def test_the_chosen_sdpa_backend_runs_the_step():
    assert _step_ops(ParallelConfig())[FLASH] == CFG.n_layers  # torch's own choice on the CPU
    math = _step_ops(ParallelConfig(), attention="math")
    assert math[FLASH] == 0 and math[MATH] == CFG.n_layers


@pytest.mark.parametrize(("setting", "forward_runs"), [("true", 2), ("false", 1)])
def test_selective_replays_fused_attention_or_saves_it(setting: str, forward_runs: int):
    par = ParallelConfig(activation_checkpoint="selective", recompute_attention=setting)
    assert _step_ops(par)[FLASH] == forward_runs * CFG.n_layers


def test_auto_is_the_devices_choice():
    assert attention_recomputed("auto", CPU) is True  # HLAT's policy
    assert attention_recomputed("auto", torch.device("cuda")) is False  # GPUs save the fused kernel's output
    assert attention_recomputed("false", CPU) is False


def test_a_backend_the_device_lacks_is_refused_naming_the_field():
    with pytest.raises(
        ConfigError,
        match=r"train\.attention_backend: got .cudnn., which cpu does not offer; choose one of auto, flash, math$",
    ):
        build_parallel_model(
            CFG,
            parallel=ParallelConfig(),
            layout=Layout(1, 0, Degrees(), None),
            device=CPU,
            seed=0,
            n_microbatches=1,
            precision=PrecisionConfig(mode="fp32"),
            attention="cudnn",
        )
    with pytest.raises(ConfigError, match=r"train\.attention_backend: .*cpu does not offer"):
        trainer_module.Trainer(
            load_config("tiny", overrides=["--train.device", "cpu", "--train.attention_backend", "cudnn"]),
            resume="fresh",
        )


def test_wrong_values_name_the_field():
    with pytest.raises(ConfigError, match=r"train\.attention_backend: got 'fast'; choose one of auto, cudnn"):
        load_config("tiny", overrides=["--train.attention_backend", "fast"])
    with pytest.raises(
        ConfigError, match=r"parallel\.recompute_attention: applies to activation_checkpoint = 'selective' only"
    ):
        load_config("tiny", overrides=["--parallel.recompute_attention", "false"])
