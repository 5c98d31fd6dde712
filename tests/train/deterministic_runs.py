"""Scenario functions (tests/runs.py) of tests/train/test_deterministic.py: layout_runs.train with
this process's intra-op threads set first, as a user's machine would have them, or expecting
replay to stop the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from hlat.train.replay import WrongComputation

sys.path.insert(0, str(Path(__file__).parent))
from layout_runs import train  # noqa: E402


def train_with_threads(ctx, threads: int, **kwargs) -> None:  # noqa: ANN001  (a ScenarioContext)
    torch.set_num_threads(threads)
    try:
        train(ctx, **kwargs)
    finally:
        torch.set_num_threads(1)  # the launch's setting, for the scenarios after this one


def train_expecting_wrong_computation(ctx, **kwargs) -> None:  # noqa: ANN001  (a ScenarioContext)
    """layout_runs.train, where replay is to name a rank: what it raised, to refused.rank<r>.json."""
    try:
        train(ctx, **kwargs)
    except WrongComputation as err:
        (ctx.out / f"refused.rank{ctx.rank}.json").write_text(json.dumps({"message": str(err), "code": err.exit_code}))
