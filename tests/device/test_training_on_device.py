"""hlat's own training loop on a device that is not the CPU (the simulated accelerator): the same
losses as the CPU's, bit for bit in fp32 eager, and checkpoints that resume exactly on it and
across it and the CPU, both ways. A host tensor left in the step (a loss summed into a host tensor)
or a batch never moved to the device fails here while every CPU test passes, and so does a restore
that expects a device generator's state in a CPU checkpoint (which has none). These runs draw from
no generator (the initial weights are a function of the seed: hlat.parallel.init_values), so which
generator a resume restores cannot show here: RNG state saved from the CPU's fails the bf16-sr
resume of test_modes_and_commands_on_device.py, whose steps draw from the device's."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from device import simulated_device  # noqa: E402
from device.device_runs import foreach_adamw_on_cpu, train_here  # noqa: E402

simulated_device.register()

STEPS = 4
HALF = "--checkpoint.every", "2"  # each run also saves step 2: the checkpoint the resumes start from


@pytest.fixture(scope="module")
def uninterrupted(small_corpus, tmp_path_factory) -> dict[str, tuple[Path, list[float]]]:
    """Per device: the run directory of STEPS uninterrupted steps (checkpoints at 2 and STEPS) and its losses."""
    runs = {}
    with foreach_adamw_on_cpu():
        for device in ("cpu", simulated_device.TYPE):
            run = tmp_path_factory.mktemp("uninterrupted") / device
            runs[device] = run, train_here(small_corpus, run, device, STEPS, *HALF)
    return runs


def test_training_on_the_device_equals_the_cpu(uninterrupted):
    assert uninterrupted[simulated_device.TYPE][1] == uninterrupted["cpu"][1]  # fp32, eager: exactly


@pytest.mark.parametrize(
    ("source", "target"),
    [(simulated_device.TYPE, simulated_device.TYPE), (simulated_device.TYPE, "cpu"), ("cpu", simulated_device.TYPE)],
)
def test_a_checkpoint_resumes_exactly_across_devices(source, target, uninterrupted, small_corpus, tmp_path):
    """Step 2's checkpoint of the run on `source`, resumed to STEPS on `target` as a user would (the
    CPU with its fused AdamW, the device with foreach): the uninterrupted run's losses."""
    saved, losses = uninterrupted[source]
    run = tmp_path / "resumed"
    shutil.copytree(saved, run, ignore=shutil.ignore_patterns(f"step_{STEPS:08d}"))
    resumed = train_here(small_corpus, run, target, STEPS, *HALF, resume="require")  # from step 2, not anew
    assert resumed == losses
