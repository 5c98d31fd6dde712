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


def measure_matmul_tflops(device: torch.device, dtype: torch.dtype, n: int = 1024, seconds: float = 0.3) -> float:
    """Best-of-runs throughput of an n x n matmul: a practical peak for devices without a data sheet."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best, deadline = 0.0, time.perf_counter() + seconds
    torch.matmul(a, b)  # warm-up: kernel selection, thread pool start
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.matmul(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = max(best, 2 * n**3 / (time.perf_counter() - start))
    return best / 1e12
