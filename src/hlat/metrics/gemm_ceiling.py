"""The achievable matmul rate of this machine: the best GEMM throughput over a few shapes,
measured once per machine and kept in the hlat cache directory for a week (MAX_AGE_S). A CPU
figure measured while other work shared the cores (`cpu_load_note`: a load average above the
core count) is used for this run only and not kept, so the next start measures again.

The shapes are the model's own feed-forward matmuls at micro_batch x seq_len rows, as a training
step runs them (forward, input gradient, weight gradient, with their transposed operands), plus
a square 1024 one. Each is timed for at least `seconds` (best of the repeats: the machine's
rate, not its load's). The cache key holds what changes the answer: the device's model name,
the threads in use, the torch version, the dtype and the shapes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hlat.atomic_files import write_atomic
from hlat.device.runtime import synchronize

CACHE_FILE = "gemm_ceiling.json"
MAX_AGE_S = 7 * 24 * 3600  # an entry older than this is measured again
Shape = tuple[int, int, int, bool, bool]  # m, k, n, A transposed, B transposed


def model_shapes(d_model: int, ffn_dim: int, rows: int) -> list[Shape]:
    """(m, k, n, A^T, B^T) of x @ W^T (up projection), g @ W (its input gradient, the down
    projection's shape), g^T @ x (its weight gradient), and a square 1024 reference."""
    return [
        (rows, d_model, ffn_dim, False, True),
        (rows, ffn_dim, d_model, False, False),
        (ffn_dim, rows, d_model, True, False),
        (1024, 1024, 1024, False, False),
    ]


def gemm_ceiling_tflops(
    device: torch.device,
    device_name: str,
    dtype: torch.dtype,
    shapes: list[Shape],
    cache_dir: Path,
    seconds: float = 0.2,
    measure: Callable[..., float] | None = None,
    keep: bool = True,
) -> tuple[float, bool]:
    """(best TFLOP/s over `shapes`, whether it came from the cache); a new measurement is cached
    only with `keep`."""
    key = "|".join(
        [
            device_name,
            f"{torch.get_num_threads()} threads",
            torch.__version__,
            str(dtype),
            ";".join(",".join(map(str, s)) for s in shapes),
        ]
    )
    path = cache_dir / CACHE_FILE
    cache = _load(path)
    entry = cache.get(key)
    if isinstance(entry, dict) and time.time() - float(entry.get("measured_at", 0)) < MAX_AGE_S:
        return float(entry["tflops"]), True
    measure = measure or measure_gemm_tflops
    best = max(measure(device, dtype, shape, seconds) for shape in shapes)
    if keep:
        cache[key] = {"tflops": best, "measured_at": time.time()}  # an entry without a time (older files) is stale
        _store(path, cache)
    return best, False


def cpu_load_note(
    device: torch.device, load: tuple[float, float, float] | None = None, cores: int | None = None
) -> str | None:
    """On a CPU whose 1-minute load average (`load`, default os.getloadavg()) exceeds its cores:
    more tasks wanted them than there were, so a GEMM timed now reads low. The note says so; None
    on an idle enough CPU, and on other devices."""
    if device.type != "cpu":
        return None
    load = load or os.getloadavg()
    cores = cores or os.cpu_count() or 1
    if load[0] <= cores:
        return None
    return f"measured under load (load average {load[0]:.1f} on {cores} cores): not cached, measured again next start"


def measure_gemm_tflops(device: torch.device, dtype: torch.dtype, shape: Shape, seconds: float) -> float:
    """Best-of-repeats TFLOP/s of one GEMM, repeated for at least `seconds` (and 3 times)."""
    m, k, n, a_t, b_t = shape
    a = torch.randn((k, m) if a_t else (m, k), device=device, dtype=dtype)
    b = torch.randn((n, k) if b_t else (k, n), device=device, dtype=dtype)
    a, b = (a.t() if a_t else a), (b.t() if b_t else b)
    torch.matmul(a, b)  # warm-up: kernel selection, thread pool start
    synchronize(device)
    best, runs, deadline = float("inf"), 0, time.perf_counter() + seconds
    while runs < 3 or time.perf_counter() < deadline:
        runs += 1
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e12


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # absent or unreadable: measure again and rewrite it
    return data if isinstance(data, dict) else {}


def _store(path: Path, cache: dict[str, Any]) -> None:
    """Atomic: a concurrent reader sees the old file or the new one, never half of one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(cache, indent=1, sort_keys=True))
    except OSError:
        pass  # a read-only cache costs a measurement next time, nothing else
