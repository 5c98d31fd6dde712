"""The syntax of a device setting, checked without importing torch (config validation uses it)."""

from __future__ import annotations

import re

_NAME = re.compile(r"[a-z][a-z0-9_]*(:\d+)?")


def device_name_problem(name: str) -> str | None:
    """Why `name` cannot name a device (None when it can): "auto", or a device type with an
    optional index. Whether that type exists here is known only once torch is loaded (resolve)."""
    if name == "auto" or _NAME.fullmatch(name):
        return None
    return f"got {name!r}; use auto (the accelerator torch finds, else the CPU), cpu, or a device type and index such as cuda:1"


DEVICE_HELP = (
    "auto (torch's accelerator, else the CPU), cpu, or a device type with an optional index: "
    "cuda, cuda:1, neuron, xpu, ... (docs/devices.md)"
)
