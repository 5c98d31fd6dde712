"""Theoretical peak FLOP/s of the CPU cores a process uses: cores x FLOPs/cycle x maximum clock.

FLOPs per cycle per core come from the vector instruction set torch dispatches to
(torch.backends.cpu.get_cpu_capability()), assuming 2 FMA units per core, as on most server
and desktop x86 cores since Haswell / Zen 2 (some parts have 1, e.g. some Xeon Silver/Bronze
AVX-512 units: their true peak is half, so MFU there reads low, never above 100%):
  AVX2 (256-bit FMA): 2 units x 8 fp32 lanes x 2 (multiply + add) = 32
  AVX-512:            2 units x 16 fp32 lanes x 2                  = 64
bf16 matmuls (precision.mode mixed):
  AMX-BF16: 1024 FLOPs/cycle per core (Intel 64 and IA-32 Architectures Optimization Reference
    Manual, Intel AMX chapter: one TMUL multiply of 16x32 by 32x16 bf16 tiles = 512 FMAs per cycle);
  AVX512-BF16: VDPBF16PS does two bf16 products per fp32 lane, so 2 x the AVX-512 fp32 figure;
  otherwise bf16 is emulated in fp32 registers: the fp32 figure is the ceiling.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

FP32_FLOPS_PER_CYCLE = {  # torch.backends.cpu.get_cpu_capability() -> per core, 2 FMA units
    "AVX512": (64, "AVX-512 FMA"),
    "AVX2": (32, "AVX2 FMA"),
    "SVE256": (32, "SVE-256 FMA"),
    "DEFAULT": (16, "128-bit FMA"),  # NEON on Arm, or the scalar+SSE fallback: 2 x 4 lanes x 2
}
AMX_BF16_FLOPS_PER_CYCLE = 1024

CPUINFO = Path("/proc/cpuinfo")
MAX_FREQ = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")


@dataclass(frozen=True)
class CpuFacts:
    model: str  # "AMD EPYC 7B13", for the cache key and messages
    capability: str  # torch.backends.cpu.get_cpu_capability()
    flags: frozenset[str]
    ghz: float | None
    clock_source: str  # where ghz was read
    physical_cores: int  # usable by this process


@dataclass(frozen=True)
class CpuPeak:
    gflops: float
    explanation: str  # "2 cores x 32 FLOP/cycle (AVX2 FMA, fp32) x 2.45 GHz (...)"


def cpu_peak(facts: CpuFacts, threads: int, dtype: torch.dtype) -> CpuPeak | None:
    """The peak of `threads` threads (capped by physical cores) in `dtype`; None where the
    instruction set or the clock is unknown."""
    if facts.capability not in FP32_FLOPS_PER_CYCLE or facts.ghz is None:
        return None
    per_cycle, isa = FP32_FLOPS_PER_CYCLE[facts.capability]
    kind = "fp32"
    if dtype == torch.bfloat16:
        if "amx_bf16" in facts.flags:
            per_cycle, isa, kind = AMX_BF16_FLOPS_PER_CYCLE, "AMX", "bf16"
        elif "avx512_bf16" in facts.flags:
            per_cycle, isa, kind = 2 * FP32_FLOPS_PER_CYCLE["AVX512"][0], "AVX512-BF16", "bf16"
        else:
            kind = "bf16 emulated in fp32"
    cores = max(1, min(threads, facts.physical_cores))
    return CpuPeak(
        cores * per_cycle * facts.ghz,
        f"{cores} core{'s' * (cores > 1)} x {per_cycle} FLOP/cycle ({isa}, {kind}) x {facts.ghz:.3g} GHz "
        f"({facts.clock_source})",
    )


def has_native_bf16(flags: frozenset[str]) -> bool:
    return bool({"amx_bf16", "avx512_bf16", "bf16"} & flags)  # "bf16": Arm's BF16 extension


def read_cpu_facts() -> CpuFacts:
    """This machine's CPU, from /proc/cpuinfo, /sys and lscpu (each optional)."""
    cpuinfo = CPUINFO.read_text(errors="replace") if CPUINFO.is_file() else ""
    model = _first(r"^model name\s*:\s*(.+)$", cpuinfo) or "unknown CPU"
    flags = frozenset((_first(r"^(?:flags|Features)\s*:\s*(.+)$", cpuinfo) or "").split())
    ghz, source = max_clock_ghz(cpuinfo, _read(MAX_FREQ), _lscpu())
    return CpuFacts(model, torch.backends.cpu.get_cpu_capability(), flags, ghz, source, physical_cores(cpuinfo))


def max_clock_ghz(cpuinfo: str, max_freq_khz: str, lscpu: str) -> tuple[float | None, str]:
    """(GHz, where it came from): cpufreq's maximum, else lscpu's "CPU max MHz", else the clock
    /proc/cpuinfo reports (the current or nominal one: below any boost clock)."""
    if max_freq_khz.strip().isdigit():
        return int(max_freq_khz) / 1e6, f"max clock from {MAX_FREQ}"
    mhz = _first(r"^CPU max MHz:\s*([\d.]+)", lscpu)
    if mhz:
        return float(mhz) / 1e3, "max clock from lscpu 'CPU max MHz'"
    mhz = _first(r"^cpu MHz\s*:\s*([\d.]+)", cpuinfo)
    if mhz:
        return float(mhz) / 1e3, "clock from /proc/cpuinfo 'cpu MHz': no max clock is exposed here"
    return None, "no clock found"


def physical_cores(cpuinfo: str) -> int:
    """Physical cores among the CPUs this process may run on (hyperthreads share a core's FMA units)."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores = set()
    for block in cpuinfo.split("\n\n"):
        cpu, package, core = (_first(rf"^{key}\s*:\s*(\d+)", block) for key in ("processor", "physical id", "core id"))
        if cpu is not None and int(cpu) in allowed:
            cores.add((package, core) if core is not None else cpu)
    return len(cores) or len(allowed)


def _first(pattern: str, text: str) -> str | None:
    match = re.search(pattern, text, re.MULTILINE)
    return match.group(1).strip() if match else None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _lscpu() -> str:
    try:
        return subprocess.run(
            ["lscpu"], capture_output=True, text=True, timeout=5, env={**os.environ, "LC_ALL": "C"}
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
