"""scripts/slurm.sbatch as Slurm runs it, with `srun` and `scontrol` stood in for by scripts that
record their arguments: after a run whose replay named a node (train.replay_every), the job is
requeued without that node; after any other failure it is not."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm.sbatch"


def _tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _job(tmp_path: Path, record: dict | None) -> tuple[int, list[str]]:
    """Run the script; `srun` appends `record` (if any) to metrics.jsonl and fails, as a run whose
    ranks stopped does. The job's exit status and the scontrol calls, one line each."""
    run_dir, bin_dir = tmp_path / "run", tmp_path / "bin"
    run_dir.mkdir()
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.log"
    _tool(bin_dir, "scontrol", f'echo "$*" >> {calls}; [ "$1" = show ] && echo node1; true')
    line = json.dumps(record) if record else ""
    _tool(bin_dir, "srun", f"[ -n '{line}' ] && echo '{line}' >> {run_dir}/metrics.jsonl; exit 1")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHON": sys.executable,
        "RUN_DIR": str(run_dir),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node[1-4]",
        "SLURM_NNODES": "4",
    }
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, calls.read_text().splitlines() if calls.is_file() else []


def _replay(hosts: list[str], when: float) -> dict:
    where = [f"global rank {i}, host {h}, device cuda:{i}" for i, h in enumerate(hosts)]
    return {"step": 7, "time": when, "replay": {"ranks": list(range(len(hosts))), "where": where, "hosts": hosts}}


def test_a_named_node_is_left_out_of_the_requeued_job(tmp_path):
    status, calls = _job(tmp_path, _replay(["node3", "node3"], time.time() + 5))
    assert status == 1
    assert calls[1:] == ["update JobId=42 ExcNodeList=node3", "requeue 42"], calls


@pytest.mark.parametrize("record", [None, _replay(["node3"], 0.0)], ids=["no replay record", "an older job's"])
def test_other_failures_are_not_requeued(tmp_path, record):
    status, calls = _job(tmp_path, record)
    assert status == 1
    assert calls == ["show hostnames node[1-4]"], calls
