"""The device's runtime, through torch.get_device_module(device.type), looked up at each call.

A module that lacks a function (the CPU has no RNG state or allocator statistics of its own; a
PrivateUse1 backend may offer only part of torch.cuda's surface) answers None or does nothing,
so every caller has one path for every device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from hlat.accelerators import Accelerator, identify


def device_module(device_type: str) -> ModuleType | None:
    """torch.<type> (torch.cuda, torch.neuron, a registered backend's module); None for a type
    without one (meta, or a backend whose package is not loaded)."""
    try:
        return torch.get_device_module(device_type)
    except RuntimeError:
        return None


def _function(device: torch.device, name: str) -> Callable[..., Any] | None:
    return getattr(device_module(device.type), name, None)


def is_available(device_type: str) -> bool:
    check = getattr(device_module(device_type), "is_available", None)
    return bool(check()) if check is not None else False


def device_count(device_type: str) -> int:
    count = getattr(device_module(device_type), "device_count", None)
    return int(count()) if count is not None else 0


def set_device(device: torch.device) -> None:
    """Make `device` this process's current one of its type (kernels launched without a device go there)."""
    setter = _function(device, "set_device")
    if device.type != "cpu" and device.index is not None and setter is not None:
        setter(device.index)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    sync = _function(device, "synchronize")
    if device.type != "cpu" and sync is not None:
        sync(device)


def rng_state(device: torch.device) -> torch.Tensor | None:
    """The device's own generator state; None where it has none apart from the CPU's."""
    get = _function(device, "get_rng_state")
    return None if device.type == "cpu" or get is None else get(device)


def set_rng_state(state: torch.Tensor, device: torch.device) -> None:
    set_state = _function(device, "set_rng_state")
    if device.type != "cpu" and set_state is not None:
        set_state(state, device)


@contextlib.contextmanager
def fork_rng(device: torch.device) -> Iterator[None]:
    """Run the body and put back the CPU's and the device's generators as they were."""
    cpu, own = torch.get_rng_state(), rng_state(device)
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if own is not None:
            set_rng_state(own, device)


def memory_peaks(device: torch.device) -> tuple[int, int | None] | None:
    """(peak bytes in tensors, peak bytes the allocator reserved or None) since the last reset;
    None where the device module keeps no allocator statistics (the CPU)."""
    allocated, reserved = _function(device, "max_memory_allocated"), _function(device, "max_memory_reserved")
    if device.type == "cpu" or allocated is None:
        return None
    return allocated(device), None if reserved is None else reserved(device)


def reset_memory_peaks(device: torch.device) -> bool:
    """Start the peaks from now; False where there are none to reset."""
    reset = _function(device, "reset_peak_memory_stats")
    if device.type == "cpu" or reset is None:
        return False
    reset(device)
    return True


def mem_get_info(device: torch.device) -> tuple[int, int] | None:
    """(free, total) bytes of the device's memory; None where the module cannot say."""
    info = _function(device, "mem_get_info")
    return None if device.type == "cpu" or info is None else tuple(info(device))


def device_name(device: torch.device) -> str | None:
    """The name the device reports (e.g. "NVIDIA H100 80GB HBM3"); None where it reports none."""
    name = _function(device, "get_device_name")
    return None if device.type == "cpu" or name is None else str(name(device))


def total_memory(device: torch.device) -> int | None:
    props = _function(device, "get_device_properties")
    return None if device.type == "cpu" or props is None else getattr(props(device), "total_memory", None)


def capability(device: torch.device) -> tuple[int, int] | None:
    """The device's compute capability (major, minor) where its module reports one."""
    get = _function(device, "get_device_capability")
    return None if device.type == "cpu" or get is None else tuple(get(device))


def accelerator(device: torch.device) -> tuple[str, Accelerator | None] | None:
    """(the name the device reports, its row of hlat.accelerators or None); None for a device
    that reports no name (the CPU, which hlat.metrics.cpu_peak measures instead)."""
    name = device_name(device)
    return None if name is None else (name, identify(name, total_memory(device) or 0))


def record_memory_history(device: torch.device, enabled: bool) -> bool:
    """Start (or stop) the allocator's history for a memory snapshot; False where it keeps none."""
    record = getattr(getattr(device_module(device.type), "memory", None), "_record_memory_history", None)
    if device.type == "cpu" or record is None:
        return False
    record(max_entries=1_000_000) if enabled else record(enabled=None)
    return True


def dump_memory_snapshot(device: torch.device, path: Path) -> bool:
    dump = getattr(getattr(device_module(device.type), "memory", None), "_dump_snapshot", None)
    if device.type == "cpu" or dump is None:
        return False
    dump(str(path))
    return True


def collective_device(device: torch.device) -> torch.device:
    """Where a small host-side tensor for a collective over the default group goes: the host when
    gloo serves host tensors (every group hlat starts: hlat.parallel.mesh), else `device`."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return device
    backend = str(dist.get_backend())
    return torch.device("cpu") if backend == "gloo" or backend.startswith("cpu:gloo") else device
