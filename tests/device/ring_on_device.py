"""Ring attention on the simulated device's CUDA-like profile against one process's attention
(a scenario of test_ring_on_device.py, see tests/runs.py): tests/parallel/ring_attention_worker.py's
comparison with the ring's tensors on the device, and the calls of each of the profile's kernels."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
from device import profiles, simulated_device  # noqa: E402
from parallel.ring_attention_worker import compare_on  # noqa: E402

simulated_device.register()  # at import: the scenario worker forms the group on its backend before the call


def compare(ctx: Any, kv_heads: int, documents: bool) -> None:
    calls: Counter[str] = Counter()
    with profiles.profile(profiles.CUDA_LIKE), profiles.counted_kernels(calls):
        compare_on(ctx, kv_heads, documents, torch.device(simulated_device.TYPE))
    path = ctx.out / f"errors.rank{ctx.rank}.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"kernel_calls": calls}))
