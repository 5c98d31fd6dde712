"""parallel.compile_mode reaches torch.compile, for the start-up probe and for every block, on
inductor alone; elsewhere, and for an unknown mode, a one-line error names the field."""

from __future__ import annotations

import pytest
import torch

from hlat.config.data import DataConfig
from hlat.config.layout import Degrees
from hlat.config.load import load_config
from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.config.train import TrainConfig
from hlat.device.record import DeviceRecord
from hlat.errors import ConfigError
from hlat.parallel import compile as compile_mod
from hlat.parallel.mesh import Layout
from hlat.parallel.parallelize import build_parallel_model

CPU = torch.device("cpu")
MODEL = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
AUTOTUNE = "max-autotune-no-cudagraphs"


@pytest.fixture
def compile_calls(monkeypatch):
    """torch.compile's keyword arguments, call by call; the module runs eager."""
    calls: list[dict] = []

    def spy(module, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs)
        return module

    monkeypatch.setattr(torch, "compile", spy)
    monkeypatch.setattr(compile_mod, "compile_disabled_by_torch", lambda: False)  # the suite sets TORCH_COMPILE_DISABLE
    return calls


def _decide(mode: str):  # type: ignore[no-untyped-def]
    return compile_mod.decide_compile(
        model=MODEL,
        parallel=ParallelConfig(compile="true", compile_mode=mode),
        precision=PrecisionConfig(mode="fp32"),
        train=TrainConfig(micro_batch=2),
        data=DataConfig(seq_len=16, document_masking=False),
        device=CPU,
    )


@pytest.mark.parametrize(("mode", "passed"), [("default", {}), (AUTOTUNE, {"mode": AUTOTUNE})])
def test_the_mode_reaches_the_probe_and_every_block(compile_calls, mode: str, passed: dict):
    decision = _decide(mode)
    assert decision.enabled and (AUTOTUNE in decision.line) == (mode == AUTOTUNE)
    par = ParallelConfig(compile_mode=mode)
    build_parallel_model(
        MODEL,
        parallel=par,
        layout=Layout(1, 0, Degrees(), None),
        device=CPU,
        seed=0,
        n_microbatches=1,
        precision=PrecisionConfig(mode="fp32"),
        compiled=True,
    )
    assert len(compile_calls) == 1 + MODEL.n_layers
    for kwargs in compile_calls:
        assert {k: v for k, v in kwargs.items() if k == "mode"} == passed
        assert kwargs["backend"] == "inductor" and kwargs["fullgraph"]


def test_other_backends_take_no_mode(compile_calls, monkeypatch):
    assert compile_mod.compile_options("aot_eager", AUTOTUNE) == {}
    monkeypatch.setattr(compile_mod, "device_record", lambda kind: DeviceRecord(kind, compile_backend="neuron"))
    with pytest.raises(
        ConfigError, match=r"parallel\.compile_mode: max-autotune-no-cudagraphs is inductor's; cpu compiles with neuron"
    ):
        _decide(AUTOTUNE)
    assert not compile_calls


def test_an_unknown_mode_names_the_field():
    with pytest.raises(
        ConfigError,
        match=r"parallel\.compile_mode: got 'max-autotune'; choose one of default, max-autotune-no-cudagraphs",
    ):
        load_config("tiny", overrides=["--parallel.compile_mode", "max-autotune"])
