"""Training on the simulated accelerator and on the CPU with the same numerics, for comparison:
a scenario function (tests/runs.py) and what the single-process device tests share."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from hlat import precision
from hlat.config.load import load_config
from hlat.device import record
from hlat.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).parents[1]))
from device import profiles, simulated_device  # noqa: E402
from runs import ScenarioContext, tiny_args  # noqa: E402
from train import layout_runs  # noqa: E402

simulated_device.register()  # at import: the scenario worker forms the group on its backend before the call


@contextlib.contextmanager
def foreach_adamw_on_cpu() -> Iterator[None]:
    """The simulated device has no fused AdamW (an unknown type's record): the CPU runs the same
    foreach update inside this block, so the two devices' numbers can be compared exactly."""
    cpu = dataclasses.replace(record.RECORDS["cpu"], fused_adamw=False)
    with mock.patch.dict(record.RECORDS, cpu=cpu):
        yield


@contextlib.contextmanager
def accelerator_compute_on_cpu() -> Iterator[None]:
    """The bf16 storage modes compute in fp32 on a CPU and in bf16 on any other device
    (hlat.precision): inside this block the CPU takes the other devices' path, so a CPU reference
    and a device run compute alike."""
    original = precision.compute_dtype
    with mock.patch.object(precision, "compute_dtype", lambda mode, device=None: original(mode)):
        yield


def train(ctx: ScenarioContext, device: str, steps: int, extra: list[str] = (), profile: str = "") -> None:
    """layout_runs.train on `device` (the simulated one present; each rank on its own simdev:0,
    simulated_device.DEVICE_COUNT says why), eager, foreach AdamW on either; `profile`: the
    simulated device under that profile of tests/device/profiles.py, with its own AdamW."""
    simulated_device.register()
    args = [*extra, "--train.device", device, "--parallel.compile", "false"]
    if profile:
        with profiles.profile(profiles.PROFILES[profile]):
            layout_runs.train(ctx, steps, args)
        return
    with simulated_device.present(), foreach_adamw_on_cpu():
        layout_runs.train(ctx, steps, args)


def train_here(
    corpus: Path, run: Path, device: str, steps: int, *extra: str, resume: str = "auto", profile: str = ""
) -> list[float]:
    """Train the tiny model in this process on `device` (the simulated one present, under `profile`
    if given), eager, resuming what `run` holds (Trainer's `resume` mode); every loss
    metrics.jsonl holds (an earlier run's too)."""
    args = tiny_args(corpus, run, "--train.steps", str(steps), "--train.device", device, "--parallel.compile", "false")
    present = profiles.profile(profiles.PROFILES[profile]) if profile else simulated_device.present()
    with present:
        Trainer(load_config("tiny", None, [*args, *extra]), resume=resume, out=lambda _: None).fit()
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
