"""parallel.device_layout: a preset's tp gives way to FSDP2 without TP on devices whose compiled
blocks do not take tensor parallelism, for models of up to 9B parameters where memory allows."""

from __future__ import annotations

import pytest

import hlat.train.build as build_module
import hlat.train.trainer as trainer_module
from hlat.config.load import load_config
from hlat.device.record import DeviceRecord
from hlat.errors import ConfigError
from hlat.planning.device_layout import GIB, device_layout

FSDP_FIRST = DeviceRecord("gpu", data_parallel_first=True)


def test_a_presets_tp_gives_way_to_fsdp_without_tp():
    cfg = load_config("llama3.1-8b", world=8)
    out, line = device_layout(cfg, 8, FSDP_FIRST, 141 * GIB)
    assert (out.parallel.tp, out.parallel.dp_sharding) == (1, "zero2")
    assert cfg.parallel.tp == 8  # the loaded config is left as it was
    assert line.startswith("layout: tp 1, zero2 over 8 data-parallel ranks instead of the preset's tp 8")


def test_fsdp_when_the_presets_sharding_does_not_fit():
    cfg = load_config("llama3.1-8b", world=8)
    out, line = device_layout(cfg, 8, FSDP_FIRST, 90 * GIB)  # zero2 plans 98 GiB, fsdp 83
    assert (out.parallel.tp, out.parallel.dp_sharding) == (1, "fsdp")


@pytest.mark.parametrize(
    ("preset", "overrides", "record", "memory"),
    [
        ("llama3.1-8b", ["--parallel.tp", "8"], FSDP_FIRST, 141 * GIB),  # tp chosen by the user
        ("llama3.1-8b", ["--parallel.device_layout", "config"], FSDP_FIRST, 141 * GIB),
        ("llama3.1-8b", [], DeviceRecord("gpu"), 141 * GIB),  # a device whose compiled TP blocks work
        ("llama3.1-8b", [], FSDP_FIRST, None),  # memory unknown
        ("llama3.1-8b", [], FSDP_FIRST, 8 * GIB),  # does not fit
        ("hlat-70b-gpu", [], FSDP_FIRST, 141 * GIB),  # over 9B parameters
    ],
)
def test_the_configured_layout_stands(preset, overrides, record, memory):
    cfg = load_config(preset, overrides=overrides, world=64)
    out, line = device_layout(cfg, 64, record, memory)
    assert (out, line) == (cfg, None)


def test_a_wrong_value_names_the_field():
    with pytest.raises(ConfigError, match=r"parallel\.device_layout: got 'fsdp'; choose one of auto, config"):
        load_config("tiny", overrides=["--parallel.device_layout", "fsdp"])


def test_the_trainer_asks_with_its_device_and_memory(monkeypatch):
    seen = []

    def spy(cfg, world, record, memory):
        seen.append((world, record.type, memory))
        raise RuntimeError("stop")

    monkeypatch.setattr(build_module, "device_layout", spy)
    with pytest.raises(RuntimeError, match="stop"):
        trainer_module.Trainer(load_config("tiny", overrides=["--train.device", "cpu"]), resume="fresh")
    assert seen == [(1, "cpu", None)]
