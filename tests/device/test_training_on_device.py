"""hlat's own training loop on a device that is not the CPU (the simulated accelerator): the same
losses as the CPU's, bit for bit in fp32 eager, and checkpoints that resume exactly on it and
across it and the CPU. A host tensor left in the step (a loss summed into a host tensor) or a
batch never moved to the device fails here while every CPU test passes. This run draws nothing
from the device's generator: RNG state saved from the CPU's fails the bf16-sr resume of
test_modes_and_commands_on_device.py, whose steps do."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from hlat.testing import simulated_device

sys.path.insert(0, str(Path(__file__).parents[1]))
from device.device_runs import foreach_adamw_on_cpu, train_here  # noqa: E402

simulated_device.register()


@pytest.fixture
def cpu_without_fused_adamw():
    with foreach_adamw_on_cpu():
        yield


def test_training_on_the_device_equals_the_cpu_and_resumes_across_devices(
    small_corpus, tmp_path, cpu_without_fused_adamw
):
    cpu = train_here(small_corpus, tmp_path / "cpu", "cpu", 4)
    device = train_here(small_corpus, tmp_path / "device", simulated_device.TYPE, 4)
    assert device == cpu  # fp32, eager: exactly

    # Two steps on the device, then resumed: on the device, and on the CPU from the same checkpoint.
    train_here(small_corpus, tmp_path / "half", simulated_device.TYPE, 2)
    for target in (simulated_device.TYPE, "cpu"):
        run = tmp_path / f"resumed-{target}"
        shutil.copytree(tmp_path / "half", run)
        resumed = train_here(small_corpus, run, target, 4)
        assert resumed[-2:] == cpu[2:], target
