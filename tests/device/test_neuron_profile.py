"""The bf16 optimizer update on a Neuron-like device (tests/device/profiles.py): compiled in the
static form its compiler accepts, equal to the eager update, and a compiler that refuses it found
by the start-up probe, not at the first optimizer step."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from device import simulated_device
from device.profiles import GRAPHS, NEURON_LIKE, NEURON_LIKE_BACKEND, REFUSES_EVERYTHING, profile
from hlat.config.load import load_config
from hlat.config.optim import OptimConfig
from hlat.config.precision import PrecisionConfig
from hlat.optim.bf16_adamw import BF16AdamW, compiled_update
from hlat.optim.update_probe import decide_update_compile
from hlat.train.trainer import Trainer
from runs import tiny_args

simulated_device.register()
DEVICE = torch.device(simulated_device.TYPE)
SHAPES = ((64, 24), (24,), (5, 7))  # three flat sizes: three static kernels


def _train(compile: bool, steps: int = 3) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).bfloat16().to(DEVICE)) for s in SHAPES]
    opt = BF16AdamW(params, lr=1e-2, weight_decay=0.1, compile=compile, seed=3)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).bfloat16().to(DEVICE)
        opt.step()
    return [p.detach().cpu() for p in params]


def test_the_update_compiles_statically_and_equals_eager(compiling):
    with profile(NEURON_LIKE):
        GRAPHS.clear()
        compiled = _train(compile=True)
        assert GRAPHS, "nothing reached the device's compiler"
        eager = _train(compile=False)
    for a, b in zip(compiled, eager, strict=True):
        assert torch.equal(a, b)  # the same arithmetic and noise, captured or not


def test_the_profile_refuses_the_dynamic_form(compiling):
    """What the optimizer compiled before the static form, on every device: refused here, as on Trainium."""
    with profile(NEURON_LIKE), pytest.raises(Exception, match="dynamic=True is rejected"):
        p, g, m, v = (torch.zeros(64, dtype=torch.bfloat16, device=DEVICE) for _ in range(4))
        one = torch.ones((), device=DEVICE)
        compiled_update(NEURON_LIKE_BACKEND, True)(
            p, g, m, v, one, one, one, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
            stochastic=True, offset=0, seed=5,
        )  # fmt: skip


def test_a_refused_update_is_a_warning_at_start_and_runs_eager(compiling):
    refusing = dataclasses.replace(NEURON_LIKE, compile_backend=REFUSES_EVERYTHING)
    with profile(refusing):
        decision = decide_update_compile(precision=PrecisionConfig(mode="bf16-sr"), optim=OptimConfig(), device=DEVICE)
    assert not decision.compiled
    assert decision.line.startswith("warning: optimizer: torch.compile of the bf16 update failed (")
    assert "running it eager" in decision.line
    with profile(NEURON_LIKE):
        decision = decide_update_compile(precision=PrecisionConfig(mode="bf16-sr"), optim=OptimConfig(), device=DEVICE)
    assert decision.compiled and "(hlat_neuron_like, one kernel per parameter size, probe" in decision.line


def test_bf16_sr_trains_on_the_neuron_like_device(compiling, small_corpus, tmp_path: Path):
    """hlat-7b's precision mode through the trainer: the optimizer compiles in the static form
    (the blocks, which the simulated device cannot capture whole, fall back to eager with a
    warning at start), and two steps train."""
    lines: list[str] = []
    args = tiny_args(small_corpus, tmp_path / "run", "--train.steps", "2", "--train.device", simulated_device.TYPE)
    with profile(NEURON_LIKE):
        cfg = load_config("tiny", None, [*args, "--precision.mode", "bf16-sr"])
        Trainer(cfg, out=lines.append).fit()
    assert any(
        line.startswith("optimizer: bf16 update compiled (hlat_neuron_like, one kernel per parameter size")
        for line in lines
    ), lines
    losses = [
        json.loads(x)["loss"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"loss"' in x
    ]
    assert len(losses) == 2


class _Int64OnDevice(TorchDispatchMode):
    """Counts the operators that compute int64 results on the simulated device (copies aside)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[-1]
        results = out if isinstance(out, (tuple, list)) else (out,)
        if name not in ("copy_", "_to_copy") and any(
            isinstance(r, torch.Tensor) and r.device.type == simulated_device.TYPE and r.dtype == torch.int64
            for r in results
        ):
            self.count += 1
        return out


def _initial_weights(device: torch.device) -> tuple[dict[str, torch.Tensor], int]:
    from hlat.config.model import ModelConfig
    from hlat.config.parallel import ParallelConfig
    from hlat.parallel.mesh import setup
    from hlat.parallel.parallelize import build_parallel_model

    cfg = ModelConfig(vocab_size=96, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
    counter = _Int64OnDevice()
    with counter:
        model = build_parallel_model(
            cfg, parallel=ParallelConfig(), layout=setup(ParallelConfig(), device), device=device, seed=5,
            n_microbatches=1, precision=PrecisionConfig(),
        )  # fmt: skip
    weights = {n: p.detach().cpu() for part in model.parts for n, p in part.named_parameters()}
    return weights, counter.count


def test_initialisation_runs_on_the_host_where_the_record_says_so():
    """The neuron-like record's init_on_host: the initial weights are the CPU's exactly, and no
    int64 arithmetic (the value function's hash) runs on the device; the generic record runs it there."""
    cpu, _ = _initial_weights(torch.device("cpu"))
    with profile(NEURON_LIKE):
        on_host, host_ops = _initial_weights(DEVICE)
    with profile(dataclasses.replace(NEURON_LIKE, init_on_host=False)):
        on_device, device_ops = _initial_weights(DEVICE)
    assert host_ops == 0 and device_ops > 100, (host_ops, device_ops)
    for weights in (on_host, on_device):
        assert weights.keys() == cpu.keys() and all(torch.equal(weights[n], cpu[n]) for n in cpu)
