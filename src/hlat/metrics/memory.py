"""Peak memory of a logging window: the device allocator's, or the process's resident set."""

from __future__ import annotations

from pathlib import Path

import torch

from hlat.device.runtime import memory_peaks, reset_memory_peaks

GIB = 2**30
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class MemoryMeter:
    """`read()` returns this process's memory since the previous `read()` (or construction), in GiB.

    A device whose module keeps allocator statistics (CUDA, and any module with
    max_memory_allocated): `mem_peak_gib` = max_memory_allocated (tensors), `mem_reserved_gib` =
    max_memory_reserved (what the allocator holds from the driver, where the module reports it),
    both reset after each read. Elsewhere (the CPU): `mem_peak_gib` = peak resident set (VmHWM of /proc/self/status, reset after each
    read through /proc/self/clear_refs; where that is refused, or without /proc, the peak since the
    process started, from getrusage), and `mem_rss_gib` = the resident set now (VmRSS; Linux only).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._reset()

    def read(self) -> dict[str, float]:
        peaks = memory_peaks(self.device)
        if peaks is not None:
            allocated, reserved = peaks
            values = {"mem_peak_gib": allocated / GIB}
            if reserved is not None:
                values["mem_reserved_gib"] = reserved / GIB
        else:
            status = _proc_status()
            if status:
                values = {"mem_peak_gib": status["VmHWM"] / GIB, "mem_rss_gib": status["VmRSS"] / GIB}
            else:
                values = {"mem_peak_gib": _peak_rss_since_start() / GIB}
        self._reset()
        return values

    def _reset(self) -> None:
        if reset_memory_peaks(self.device):
            return
        try:  # "5" resets VmHWM to the current resident set (Linux >= 4.0); nothing else is cleared
            _CLEAR_REFS.write_text("5")
        except OSError:
            pass  # no /proc, or not allowed: the peak stays the one since start (documented above)


def _proc_status() -> dict[str, int]:
    """VmRSS and VmHWM in bytes, or {} where /proc/self/status is not there."""
    try:
        lines = _STATUS.read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024  # reported in kB
    return found if len(found) == 2 else {}


def _peak_rss_since_start() -> float:
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB elsewhere
