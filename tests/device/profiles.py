"""Device profiles for the simulated accelerator: what a real backend offers and refuses, as a
device record plus the behaviour behind it, so the wiring hlat chooses for that backend runs in
the suite against the backend's contract rather than the CPU's.

NEURON_LIKE follows TorchNeuron (awsdocs-neuron, "torch.compile backend reference", 2026-10-14):
its compile backend rejects dynamic=True ("dynamic=True is rejected during compilation ...
recompiling per new shape"), and it has no fused AdamW kernel. The backend here refuses any graph
with a symbolic size or scalar and otherwise runs the captured graph as it is (the host kernels
behind the simulated device), so numerics stay the CPU's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from torch._dynamo import register_backend
from torch.fx.experimental.symbolic_shapes import free_symbols

from device import simulated_device
from hlat.device import record

NEURON_LIKE_BACKEND = "hlat_neuron_like"
REFUSES_EVERYTHING = "hlat_refuses_everything"
GRAPHS: list[int] = []  # the node counts of the graphs NEURON_LIKE_BACKEND accepted


def _symbolic(value: Any) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.Tensor)) and bool(free_symbols(value))


@register_backend(name=NEURON_LIKE_BACKEND)
def _neuron_like(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    placeholders = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    if any(_symbolic(v) for v in placeholders):
        raise RuntimeError("dynamic=True is rejected during compilation (symbolic sizes or scalars in the graph)")
    GRAPHS.append(len(gm.graph.nodes))
    return gm.forward


@register_backend(name=REFUSES_EVERYTHING)
def _refuses(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    raise RuntimeError("this compiler takes no graph")


NEURON_LIKE = record.DeviceRecord(simulated_device.TYPE, compile_backend=NEURON_LIKE_BACKEND, compile_dynamic=False)


@contextlib.contextmanager
def profile(device_record: record.DeviceRecord) -> Iterator[None]:
    """The simulated device, present, under `device_record`."""
    simulated_device.register()
    with simulated_device.present(), mock.patch.dict(record.RECORDS, {simulated_device.TYPE: device_record}):
        yield
