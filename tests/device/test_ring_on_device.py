"""Context parallelism's ring attention on the simulated device's CUDA-like profile
(tests/device/profiles.py): two processes, each chunk pair through the device's fused operator
(CUDA's memory-efficient attention, with its padded log-sum-exp and aligned bias), the K/V passed
around the ring on the device's process group. It equals one process's causal attention, and its
document masking, forward and backward, at the CPU ring's tolerance (tests/parallel/
test_ring_attention.py: 1e-5, fp32)."""

import json

import pytest

from device import simulated_device
from runs import Scenario, ScenarioResults

CASES = {"causal": False, "documents": True}
SCENARIOS = [
    Scenario(
        f"ring-cuda-like-cp2-{name}",
        "device/ring_on_device.py:compare",
        2,
        {"kv_heads": 2, "documents": documents},
        simulated_device.TYPE,
    )
    for name, documents in CASES.items()
]


@pytest.mark.parametrize("name", CASES)
def test_the_ring_on_the_cuda_like_device_matches_one_process(scenarios: ScenarioResults, name: str) -> None:
    for rank in range(2):
        errors = json.loads((scenarios.path(f"ring-cuda-like-cp2-{name}") / f"errors.rank{rank}.json").read_text())
        calls = errors.pop("kernel_calls")
        # 2 ranks x 2 steps: 3 chunk pairs at the first, 1 at the second (causality skips the rest);
        # each pair's forward and backward through CUDA's operator, none through the CPU's
        assert calls["_scaled_dot_product_efficient_attention"] >= 3, calls
        assert calls["_scaled_dot_product_efficient_attention_backward"] >= 3, calls
        assert max(errors.values()) < 1e-5, (rank, errors)
