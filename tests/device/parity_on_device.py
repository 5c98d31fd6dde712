"""tests/parallel/parity_worker.py's layouts on the simulated device under a profile
(tests/device/profiles.py): a scenario of test_context_parallel_on_device.py, see tests/runs.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
from device import profiles, simulated_device  # noqa: E402
from parallel import parity_worker  # noqa: E402

simulated_device.register()  # at import: the scenario worker forms the group on its backend before the call


def layouts(ctx: Any, cases: list[dict], profile: str) -> None:
    with profiles.profile(profiles.PROFILES[profile]):
        parity_worker.layouts(ctx, cases, device=torch.device(simulated_device.TYPE))
