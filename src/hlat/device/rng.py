"""Capture and restore every random-number generator a run uses, for exact resumes.

The state is {"cpu": the CPU generator's, "device": {"type": the device type, "state": its
generator's}} ("device" only where the device has a generator of its own). Checkpoints written
before this layout kept a CUDA generator under "cuda"; they still load. A state saved on another
device type restores the CPU generator only: the other device's generator means nothing here.
"""

from __future__ import annotations

from typing import Any

import torch

from hlat.device.runtime import rng_state as device_rng_state
from hlat.device.runtime import set_rng_state

_LEGACY = "cuda"  # the only device generator older checkpoints saved, under its type's name


def rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    own = device_rng_state(device)
    if own is not None:
        state["device"] = {"type": device.type, "state": own}
    return state


def load_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    saved = state.get("device") or ({"type": _LEGACY, "state": state[_LEGACY]} if _LEGACY in state else None)
    if saved is not None and saved["type"] == device.type:
        set_rng_state(saved["state"], device)
