"""Scenario function (tests/runs.py) that starts a torchrun launch of its own in which rank 1
freezes: most of its time is the collective timeout, spent waiting beside the single-process
tests (tests/parallel/test_hang.py asserts on what it leaves)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from runs import ScenarioContext, outside, tiny_args, torchrun  # noqa: E402


def stuck_rank(ctx: ScenarioContext) -> None:
    """`hlat train` on 2 processes, rank 1 frozen at step 3 (HLAT_FAULT hang): its exit code,
    stderr and seconds to result.json, and the fault's marker file beside it."""
    env = {
        "HLAT_FAULT": "hang:3:1",
        "HLAT_FAULT_MARKER": str(ctx.out / "fault-done"),
        "HLAT_COLLECTIVE_TIMEOUT_S": "10",
    }  # > the tokenizer barrier on a loaded machine
    # interrupt_save_s 0: the frozen rank ends at torchrun's SIGTERM, not at its SIGKILL 30 s later
    # (it sleeps in the fault, so the save deadline's timer never wakes it)
    args = tiny_args(ctx.corpus, ctx.out / "run", "--train.steps", "6", "--train.interrupt_save_s", "0")
    with outside(ctx):
        start = time.monotonic()
        done = torchrun(2, ["-m", "hlat", "train", *args], env=env, timeout=180, check=False)
        elapsed = time.monotonic() - start
    result = {"returncode": done.returncode, "stderr": done.stderr, "elapsed": elapsed}
    (ctx.out / "result.json").write_text(json.dumps(result))
