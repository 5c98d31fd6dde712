"""DDP and FSDP2 over two processes on the simulated accelerator (its `simgloo` backend beside gloo)
give the CPU's losses and checkpoint exactly: the same layouts on the CPU, fp32, eager, foreach
AdamW on both."""

from __future__ import annotations

from pathlib import Path

import pytest

from device import simulated_device
from runs import Scenario, ScenarioResults, assert_same_tensors, checkpoint_tensors

LAYOUTS = {"ddp": ["--parallel.dp_sharding", "ddp"], "fsdp": ["--parallel.dp_sharding", "fsdp"]}
DEVICES = {"cpu": "cpu", simulated_device.TYPE: f"{simulated_device.TYPE}:0"}  # type: --train.device
STEPS = 2  # the first at warmup LR 0: the saved state checks the updates
SCENARIOS = [
    Scenario(
        f"device-{layout}-{kind}",
        "device/device_runs.py:train",
        2,
        {"device": name, "steps": STEPS, "extra": args},
        kind,
    )
    for layout, args in LAYOUTS.items()
    for kind, name in DEVICES.items()
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_processes_on_the_device_give_the_cpu_losses(
    scenarios: ScenarioResults, layout: str, tmp_path: Path
) -> None:
    cpu, device = (scenarios.json(f"device-{layout}-{kind}", "summary.rank0.json") for kind in DEVICES)
    assert f"on 2 x {simulated_device.TYPE} (pp 1 x dp 2 x tp 1, {layout})" in " ".join(device["messages"])
    assert len(cpu["losses"]) == STEPS and device["losses"] == cpu["losses"]
    saved = [
        checkpoint_tensors(scenarios.path(f"device-{layout}-{kind}") / f"run/checkpoints/step_{STEPS:08d}", tmp_path)
        for kind in DEVICES
    ]
    assert_same_tensors(*saved)  # the weights and AdamW moments, saved from the device
