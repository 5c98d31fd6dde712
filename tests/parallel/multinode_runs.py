"""Scenario function (tests/runs.py) that runs scripts/two_nodes_local.sh (two torchrun "nodes"
rendezvousing over 127.0.0.1) from the shared launch, with the test process's environment:
tests/parallel/test_multinode.py asserts on what it leaves."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from runs import ScenarioContext, outside  # noqa: E402

SCRIPT = Path(__file__).parents[2] / "scripts" / "two_nodes_local.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(ctx: ScenarioContext) -> None:
    """The script with one process per node training the tiny model 2 steps into ctx.out/run; its
    exit code, stdout and stderr to result.json."""
    overrides = [
        "--data.source", str(ctx.corpus), "--model.vocab_size", "512", "--model.d_model", "64",
        "--model.n_layers", "2", "--model.n_heads", "4", "--model.n_kv_heads", "2", "--model.ffn_dim", "128",
        "--model.max_seq_len", "64", "--data.seq_len", "32", "--train.global_batch", "4", "--train.micro_batch", "2",
        "--train.steps", "2", "--train.log_every", "1", "--train.tensorboard", "false", "--train.plot", "false",
        "--data.val_source", "", "--eval.every", "0", "--train.run_dir", str(ctx.out / "run"),
    ]  # fmt: skip
    with outside(ctx):
        env = {
            **os.environ,
            "HLAT_CACHE": str(ctx.out / "cache"),
            "HLAT_RDZV_PORT": str(free_port()),
            "OMP_NUM_THREADS": "1",
        }
        done = subprocess.run(
            ["bash", str(SCRIPT), "1", *overrides], capture_output=True, text=True, env=env, timeout=300
        )
    result = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
    (ctx.out / "result.json").write_text(json.dumps(result))
