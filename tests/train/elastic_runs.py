"""Scenario function (tests/runs.py) that trains one elastic replica group (elastic.enabled) in
the scenario's process, at a lighthouse of its own: the checkpoints an elastic run writes, for
the tests that resume them in other layouts (tests/train/test_elastic_faults.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from unittest import mock

from torchft.coordination import LighthouseServer

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
from layout_runs import train  # noqa: E402
from runs import ScenarioContext  # noqa: E402


def elastic(
    ctx: ScenarioContext,
    steps: int,
    shares: int,
    extra: list[str] = (),
    resume: str = "auto",
    start_from: str | None = None,
) -> None:
    """`layout_runs.train` as elastic group 0 of at most `shares` (it holds every data share)."""
    server = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=1000, heartbeat_timeout_ms=1500)
    group = ["--elastic.enabled", "true", "--elastic.lighthouse", server.address(), "--elastic.group", "0"]
    group += ["--elastic.trusted_network", "true"]  # one group alone (the secret: tests/train/test_elastic.py)
    try:
        with mock.patch.dict(os.environ):
            for name in ("MASTER_ADDR", "MASTER_PORT"):  # the group's own store, not the shared launch's
                os.environ.pop(name, None)
            train(ctx, steps, [*group, "--elastic.max_groups", str(shares), *extra], resume, start_from)
    finally:
        server.shutdown()
