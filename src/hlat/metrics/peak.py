"""The MFU denominator: the theoretical peak FLOP/s of one training device, and beside it the
achievable GEMM rate of this machine.

In order: train.peak_tflops if set; a known accelerator's dense data-sheet figure
(hlat.accelerators); on a CPU, cores x FLOPs/cycle x max clock (hlat.metrics.cpu_peak). Any other
device has no peak: MFU is left empty and one warning names the device and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hlat.device.runtime import accelerator
from hlat.metrics.cpu_peak import CpuFacts, cpu_peak, has_native_bf16, read_cpu_facts
from hlat.metrics.gemm_ceiling import Shape, cpu_load_note, gemm_ceiling_tflops


@dataclass(frozen=True)
class Peak:
    tflops: float | None  # per device (per process on a CPU); None: unknown, MFU is not computed
    summary: str  # for the start-up line: the figure and how it was obtained
    ceiling_tflops: float | None = None  # measured GEMM rate
    warning: str | None = None

    def mfu(self, flops_per_s: float, world: int) -> float | None:
        return None if self.tflops is None else flops_per_s / (self.tflops * 1e12 * world)

    def mfu_of_gemm(self, flops_per_s: float, world: int) -> float | None:
        return None if self.ceiling_tflops is None else flops_per_s / (self.ceiling_tflops * 1e12 * world)


def resolve_peak(
    device: torch.device,
    dtype: torch.dtype,
    override: float,
    shapes: list[Shape],
    cache_dir: Path,
    cpu: CpuFacts | None = None,
) -> Peak:
    """The peak for matmuls in `dtype` on `device`; `shapes` are timed for the GEMM ceiling (not
    with an override: nothing is measured then). `cpu` replaces this machine's facts (tests)."""
    if override > 0:
        return Peak(override, f"MFU against {_rate(override)} per device (set by train.peak_tflops)")
    if device.type == "cpu":
        cpu = cpu or read_cpu_facts()
        peak = cpu_peak(cpu, torch.get_num_threads(), dtype)
        if peak is None:
            return _unknown(f"this CPU ({cpu.model!r}: instruction set {cpu.capability}, {cpu.clock_source})")
        return _with_ceiling(
            peak.gflops / 1e3, "per process", f": {peak.explanation}", device, cpu.model, dtype, shapes, cache_dir
        )
    found = accelerator(device)
    if found is None:
        return _unknown(f"this {device.type} device")
    name, row = found
    if row is None:
        return _unknown(repr(name))
    tf32 = torch.get_float32_matmul_precision() != "highest"
    kind = "bf16" if dtype in (torch.bfloat16, torch.float16) else "tf32" if tf32 else "fp32"
    how = f"({name} = {row.name}, dense {kind}, {row.source})"
    return _with_ceiling(row.peak_tflops(dtype, tf32), "per device", how, device, name, dtype, shapes, cache_dir)


def slow_bf16_warning(device: torch.device, mode: str, flags: frozenset[str] | None = None) -> str | None:
    """CPUs without bf16 instructions (AMX, AVX512-BF16, Arm BF16) emulate bf16 matmuls in fp32
    registers, several times slower than fp32 ones."""
    if device.type != "cpu" or mode != "mixed":
        return None
    if has_native_bf16(read_cpu_facts().flags if flags is None else flags):
        return None
    return (
        "warning: this CPU has no bf16 instructions (no amx_bf16, avx512_bf16 or bf16 in its flags), so bf16 "
        "matmuls are emulated, several times slower than fp32: --precision.mode fp32 will train faster here"
    )


def _with_ceiling(
    tflops: float,
    per: str,
    how: str,
    device: torch.device,
    name: str,
    dtype: torch.dtype,
    shapes: list[Shape],
    cache_dir: Path,
) -> Peak:
    """`per`: "per device" or "per process"; `how`: how `tflops` was obtained."""
    load = cpu_load_note(device)
    ceiling, cached = gemm_ceiling_tflops(device, name, dtype, shapes, cache_dir, keep=load is None)
    note = f"; the GEMM ceiling was {load}" if load and not cached else ""
    if ceiling > tflops:  # the clock read (or the table) is below what the device runs at
        return Peak(
            ceiling,
            f"MFU against {_rate(ceiling)} {per}, the measured GEMM ceiling, as it exceeds the "
            f"theoretical {_rate(tflops)}{how} (the device runs faster than that figure assumes){note}",
            ceiling,
        )
    return Peak(
        tflops,
        f"MFU against {_rate(tflops)} {per}{how}; measured GEMM ceiling {_rate(ceiling)} "
        f"({ceiling / tflops:.0%} of peak){note}",
        ceiling,
    )


def _unknown(what: str) -> Peak:
    return Peak(
        None,
        "MFU not computed (no peak known)",
        warning=f"warning: no peak FLOP/s known for {what}: MFU is left empty; pass --train.peak_tflops "
        "with its dense peak TFLOP/s per device to get it",
    )


def _rate(tflops: float) -> str:
    return f"{tflops:.3g} TFLOP/s" if tflops >= 1 else f"{tflops * 1e3:.3g} GFLOP/s"
