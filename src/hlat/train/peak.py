"""Peak matmul throughput of the training device: the denominator of model FLOPs utilisation."""

from __future__ import annotations

import time

import torch

# Dense bf16 tensor-core peaks from the vendors' data sheets, TFLOP/s (no sparsity).
KNOWN_PEAKS_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10G": 125.0,
    "TRAINIUM1": 190.0,  # one trn1 NeuronCore-v2 pair ("chip"), as HLAT.md states
}


def peak_tflops(device: torch.device, dtype: torch.dtype, override: float = 0.0) -> tuple[float, str]:
    """(peak TFLOP/s, how it was obtained) for MFU. CPUs have no data-sheet number: measure one."""
    if override > 0:
        return override, "set by train.peak_tflops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device).upper()
        for key, value in KNOWN_PEAKS_TFLOPS.items():
            if key in name:
                return value, f"bf16 data-sheet peak of {name}"
    measured = measure_matmul_tflops(device, dtype)
    return measured, f"{str(dtype).removeprefix('torch.')} matmul measured on this {device.type} at start-up"


def slow_bf16_warning(device: torch.device, mode: str) -> str | None:
    """CPUs without bf16 instructions (no AVX512-BF16/AMX) emulate it, many times slower than fp32."""
    if device.type != "cpu" or mode != "mixed":
        return None
    fp32 = measure_matmul_tflops(device, torch.float32, seconds=0.1)
    bf16 = measure_matmul_tflops(device, torch.bfloat16, seconds=0.1)
    if bf16 >= fp32:
        return None
    return (f"warning: this CPU runs bf16 matmuls at {bf16 * 1e3:.3g} GFLOP/s against {fp32 * 1e3:.3g} in fp32 "
            "(no native bf16 instructions): --precision.mode fp32 will train faster here")


def measure_matmul_tflops(device: torch.device, dtype: torch.dtype, n: int = 1024, seconds: float = 0.3) -> float:
    """Best-of-runs throughput of an n x n matmul: a practical peak for devices without a data sheet."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm-up: kernel selection, thread pool start
    best, runs, deadline = 0.0, 0, time.perf_counter() + seconds
    while runs < 3 or time.perf_counter() < deadline:
        runs += 1
        start = time.perf_counter()
        torch.matmul(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = max(best, 2 * n**3 / (time.perf_counter() - start))
    return best / 1e12
