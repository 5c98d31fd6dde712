"""Scenario functions (tests/runs.py) that start a torchrun launch of their own from the shared
launch: a fault that kills a rank, torchrun's restart or its report of a failed rank must be a
launch of its own, but need not wait for the shared launch to end. The tests assert on what they
leave (tests/train/test_fault_tolerance.py, tests/train/test_async_save_fault.py,
tests/commands/test_user_errors.py, tests/commands/test_doctor.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from runs import ScenarioContext, outside, tiny_args, torchrun  # noqa: E402


def command(
    ctx: ScenarioContext, nproc: int, target: list[str], env: dict[str, str] | None = None, timeout: float = 600
) -> None:
    """`torchrun --nproc_per_node nproc TARGET` ("{out}" in TARGET or an `env` value: ctx.out), with
    `env` added; its exit code, stdout and stderr to result.json."""
    target = [arg.format(out=ctx.out) for arg in target]
    env = {name: value.format(out=ctx.out) for name, value in (env or {}).items()}
    with outside(ctx):
        done = torchrun(nproc, target, env=env, timeout=timeout, check=False)
    result = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
    (ctx.out / "result.json").write_text(json.dumps(result))


def hlat_train(ctx: ScenarioContext, nproc: int, extra: list[str], env: dict[str, str], restarts: int = 0) -> None:
    """`hlat train` of the tiny model (runs.tiny_args, run directory ctx.out/run) on `nproc`
    processes under `torchrun --max-restarts restarts`, with `env` added ("{out}" in a value:
    ctx.out); its exit code, stdout and stderr to result.json."""
    env = {name: value.format(out=ctx.out) for name, value in env.items()}
    args = tiny_args(ctx.corpus, ctx.out / "run", *extra)
    with outside(ctx):
        done = torchrun(nproc, ["-m", "hlat", "train", *args], env=env, restarts=restarts, check=False)
    result = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
    (ctx.out / "result.json").write_text(json.dumps(result))
