"""hlat's own training loop on a device that is not the CPU (the simulated accelerator): the same
losses as the CPU's, bit for bit in fp32 eager, and checkpoints that resume exactly on it and
across it and the CPU. A host tensor left in the step, RNG or memory read from the CPU, or a batch
never moved to the device fails here while every CPU test passes."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from hlat.config.load import load_config
from hlat.testing import simulated_device
from hlat.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).parents[1]))
from device.device_runs import foreach_adamw_on_cpu  # noqa: E402
from runs import tiny_args  # noqa: E402

simulated_device.register()


@pytest.fixture
def cpu_without_fused_adamw():
    with foreach_adamw_on_cpu():
        yield


def _train(corpus: Path, run: Path, device: str, steps: int, *extra: str) -> list[float]:
    args = tiny_args(corpus, run, "--train.steps", str(steps), "--train.device", device, "--parallel.compile", "false")
    with simulated_device.present():
        Trainer(load_config("tiny", None, [*args, *extra]), resume="auto", out=lambda _: None).fit()
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_training_on_the_device_equals_the_cpu_and_resumes_across_devices(
    small_corpus, tmp_path, cpu_without_fused_adamw
):
    cpu = _train(small_corpus, tmp_path / "cpu", "cpu", 4)
    device = _train(small_corpus, tmp_path / "device", simulated_device.TYPE, 4)
    assert device == cpu  # fp32, eager: exactly

    # Two steps on the device, then resumed: on the device, and on the CPU from the same checkpoint.
    _train(small_corpus, tmp_path / "half", simulated_device.TYPE, 2)
    for target in (simulated_device.TYPE, "cpu"):
        run = tmp_path / f"resumed-{target}"
        shutil.copytree(tmp_path / "half", run)
        resumed = _train(small_corpus, run, target, 4)
        assert resumed[-2:] == cpu[2:], target
