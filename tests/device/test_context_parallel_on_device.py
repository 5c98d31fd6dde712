"""Context parallelism trained on the simulated device's CUDA-like profile (each chunk pair through
CUDA's memory-efficient operator, tests/device/profiles.py) against the single process on the CPU
of tests/parallel/test_parity.py, at its tolerances: losses and gradient norms within 1e-5
relative, weights within 2e-5."""

from __future__ import annotations

import dataclasses

import pytest

from device import simulated_device
from parallel.parity_worker import Case
from parallel.test_parity import SCENARIOS as PARITY_SCENARIOS
from parallel.test_parity import check, references
from runs import Scenario

TWO = [Case(cp=2), Case(cp=2, recompute="selective", variant="documents")]
FOUR = [
    Case(cp=2, tp=2, dp_sharding="zero2"),  # the ring beside tp, pp and HSDP (2 replicas, each FSDP2 over cp 2)
    Case(pp=2, cp=2, dp_sharding="zero2"),
    Case(dp=2, dp_replicate=2, cp=2, dp_sharding="fsdp", recompute="selective", variant="documents"),
]
SCENARIOS = [
    next(s for s in PARITY_SCENARIOS if s.name == "parity-1"),  # the reference, on the CPU
    *(
        Scenario(
            f"parity-cuda-like-{world}",
            "device/parity_on_device.py:layouts",
            world,
            {"cases": [dataclasses.asdict(c) for c in cases], "profile": "cuda-like"},
            simulated_device.TYPE,
        )
        for world, cases in ((2, TWO), (4, FOUR))
    ),
]


@pytest.fixture(scope="module")
def reference(scenarios):
    return references(scenarios)


@pytest.mark.parametrize(
    ("world", "case"),
    [(2, c) for c in TWO] + [(4, c) for c in FOUR],
    ids=lambda v: v.id if isinstance(v, Case) else str(v),
)
def test_context_parallel_on_the_cuda_like_device_matches_one_process(reference, scenarios, world, case):
    check(reference, scenarios.path(f"parity-cuda-like-{world}"), case)
