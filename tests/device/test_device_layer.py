"""hlat's device layer (hlat.device): nothing else names a device type, resolution, records, the
runtime through the device module, RNG state across device types, and bf16-sr's rounding choice."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hlat.device.record import RECORDS, device_record
from hlat.device.resolve import resolve_device
from hlat.device.rng import load_rng_state, rng_state
from hlat.device.rounding import stochastic_rounding
from hlat.errors import UserError
from hlat.metrics.memory import MemoryMeter

SRC = Path(__file__).resolve().parents[2] / "src" / "hlat"
LAYER = SRC / "device"
DEVICE_WORDS = ("cuda", "nccl", "neuron", "xpu", "mps")  # device types and backends only the layer names
DEVICE_ATTRIBUTES = ("cuda", "is_cuda")  # torch.cuda, tensor.cuda(), tensor.is_cuda


def device_names_in(source: str) -> list[tuple[int, str]]:
    """(line, what) for each device-specific name in Python `source`: a string that is a device
    type or backend, or starts with "<type>:", and an attribute such as torch.cuda."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in DEVICE_ATTRIBUTES:
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            head = node.value.split(":", 1)[0]
            if node.value in DEVICE_WORDS or (head in DEVICE_WORDS and ":" in node.value):
                found.append((node.lineno, repr(node.value)))
    return sorted(found)


def test_the_scanner_finds_what_it_must():
    snippet = 'import torch\ntorch.cuda.synchronize()\nx = t.is_cuda\nb = "nccl"\nd = f"cuda:{i}"\nok = "a CUDA GPU"\n'
    assert device_names_in(snippet) == [(2, ".cuda"), (3, ".is_cuda"), (4, "'nccl'"), (5, "'cuda:'")]


def test_no_device_type_is_named_outside_the_device_layer():
    hits = [
        f"{path.relative_to(SRC.parent)}:{line}: {what}"
        for path in sorted(SRC.rglob("*.py"))
        if LAYER not in path.parents
        for line, what in device_names_in(path.read_text())
    ]
    assert not hits, "device-specific code outside src/hlat/device/ (move it into the layer):\n" + "\n".join(hits)


@pytest.fixture
def no_accelerator(monkeypatch):
    """As on a machine without one, whatever backend the test session registered."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_is_the_cpu_without_an_accelerator(no_accelerator):
    assert resolve_device("auto", "--train.device") == torch.device("cpu")
    assert resolve_device("cpu:0", "--train.device") == torch.device("cpu")


def test_an_unavailable_or_unknown_device_is_refused_naming_the_setting(no_accelerator):
    with pytest.raises(UserError, match=r"^--train\.device cuda: no cuda device is visible.*--train\.device cpu"):
        resolve_device("cuda", "--train.device")
    with pytest.raises(UserError, match=r"^--train\.device bogus: torch knows no device type 'bogus'"):
        resolve_device("bogus", "--train.device")
    with pytest.raises(UserError, match=r"^--device: got 'CUDA 0'; use auto"):
        resolve_device("CUDA 0", "--device")


def test_the_local_rank_picks_the_index(monkeypatch):
    """Through the device module, looked up at call time: here two XPUs (torch.xpu) that are not."""
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 2)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("xpu"))
    assert resolve_device("auto", "--train.device", local_rank=1) == torch.device("xpu", 1)
    assert resolve_device("xpu", "--train.device") == torch.device("xpu", 0)
    assert resolve_device("xpu:1", "--train.device", local_rank=0) == torch.device("xpu", 1)
    with pytest.raises(UserError, match=r"needs xpu:2, but 2 xpu devices are visible; .*--nproc_per_node 2"):
        resolve_device("xpu", "--train.device", local_rank=2)
    with pytest.raises(UserError, match=r"^--train\.device xpu:5: .* pick an index below 2"):
        resolve_device("xpu:5", "--train.device")


def test_a_type_without_a_row_gets_the_conservative_record(monkeypatch):
    record = device_record("unregistered")
    assert record == device_record("unregistered") and "unregistered" not in RECORDS
    assert (record.compile_backend, record.fused_adamw, record.flex_attention, record.pin_memory) == (
        None,
        False,
        False,
        False,
    )
    assert record.dist_backend is None and record.process_group_backend is None
    # A backend registered for the type later is found: torch's own map is read when asked.
    monkeypatch.setitem(dist.Backend.default_device_backend_map, "unregistered", "unregisteredccl")
    assert device_record("unregistered").process_group_backend == "cpu:gloo,unregistered:unregisteredccl"
    # A backend that declares the type without being its default (registered after another) too.
    monkeypatch.setitem(dist.Backend.backend_capability, "simccl", ["othersim"])
    assert device_record("othersim").dist_backend == "simccl"
    assert device_record("cpu").process_group_backend == "gloo"
    assert device_record("cuda").process_group_backend == "cpu:gloo,cuda:nccl"
    # A device backend that takes host tensors too runs alone, as TorchNeuron documents its own
    monkeypatch.setitem(dist.Backend.backend_capability, "simccl", ["othersim", "cpu"])
    assert device_record("othersim").process_group_backend == "simccl"


def test_several_processes_need_a_backend_for_the_device(monkeypatch):
    from hlat.config.parallel import ParallelConfig
    from hlat.parallel.mesh import setup

    monkeypatch.setattr(dist, "is_initialized", lambda: False)  # as in a fresh torchrun process
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match=r"^2 processes on meta, but no torch.distributed backend is registered"):
        setup(ParallelConfig(), torch.device("meta"))


def test_rng_state_is_saved_per_device_type_and_restored_only_on_its_type(monkeypatch):
    restored = {}
    monkeypatch.setattr(torch.xpu, "get_rng_state", lambda device=None: torch.tensor([7], dtype=torch.uint8))
    monkeypatch.setattr(torch.xpu, "set_rng_state", lambda state, device=None: restored.update(xpu=state))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device=None: restored.update(cuda=state))
    xpu = torch.device("xpu", 0)
    state = rng_state(xpu)
    assert set(state) == {"cpu", "device"} and state["device"]["type"] == "xpu"
    assert set(rng_state(torch.device("cpu"))) == {"cpu"}  # the CPU's generator is the only one

    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    saved = rng_state(xpu)
    torch.rand(3)
    load_rng_state(saved, xpu)
    assert torch.equal(torch.rand(3), expected) and torch.equal(
        restored.pop("xpu"), torch.tensor([7], dtype=torch.uint8)
    )

    load_rng_state(saved, torch.device("cpu"))  # saved on another device type: the CPU's alone
    load_rng_state({"cpu": saved["cpu"], "cuda": torch.tensor([3], dtype=torch.uint8)}, xpu)  # an old checkpoint
    assert not restored
    load_rng_state({"cpu": saved["cpu"], "cuda": torch.tensor([3], dtype=torch.uint8)}, torch.device("cuda", 0))
    assert torch.equal(restored.pop("cuda"), torch.tensor([3], dtype=torch.uint8))


def test_memory_statistics_come_from_the_device_module(monkeypatch):
    resets = []
    monkeypatch.setattr(torch.xpu, "max_memory_allocated", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(torch.xpu, "max_memory_reserved", lambda device=None: 4 * 2**30)
    monkeypatch.setattr(torch.xpu, "reset_peak_memory_stats", lambda device=None: resets.append(device))
    meter = MemoryMeter(torch.device("xpu", 0))
    assert meter.read() == {"mem_peak_gib": 3.0, "mem_reserved_gib": 4.0} and len(resets) == 2
    assert "mem_reserved_gib" not in MemoryMeter(torch.device("cpu")).read()  # the process's resident set


SWITCH = "NEURON_RT_STOCHASTIC_ROUNDING_EN"


@pytest.mark.parametrize(
    ("device_type", "mode", "environ", "hardware", "line"),
    [
        ("neuron", "bf16-sr", {SWITCH: "1"}, True, f"stochastic rounding: hardware ({SWITCH}=1)"),
        ("neuron", "bf16-sr", {SWITCH: "TRUE"}, True, f"stochastic rounding: hardware ({SWITCH}=TRUE)"),
        ("neuron", "bf16-sr", {SWITCH: "0"}, False, f"stochastic rounding: software (launch with {SWITCH}=1 for"),
        ("neuron", "bf16-sr", {}, False, "stochastic rounding: software (launch with"),
        ("cpu", "bf16-sr", {SWITCH: "1"}, False, "stochastic rounding: software"),
        ("neuron", "mixed", {SWITCH: "1"}, False, f"warning: {SWITCH}=1 makes the device round every bf16 cast"),
        ("neuron", "fp32", {SWITCH: "1"}, False, None),
        ("cpu", "fp32", {}, False, None),
    ],
)
def test_bf16_sr_takes_the_hardware_rounding_only_where_the_launch_switched_it_on(
    device_type, mode, environ, hardware, line
):
    rounding = stochastic_rounding(mode, device_record(device_type), environ)
    assert rounding.hardware is hardware
    assert rounding.line == line if line is None or line.endswith(")") else rounding.line.startswith(line)
    if device_type == "cpu" and line:
        assert rounding.line == "stochastic rounding: software"
