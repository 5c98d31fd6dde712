"""Elastic data parallelism on torchft (hlat.train.elastic): replica groups of one process each,
on gloo on one machine, with the lighthouse in this process. A group killed (SIGKILL) mid-run
drops out, the survivors go on in the same processes, the group restarted two steps later rejoins
from a live peer; every (step, share) of the data order is trained exactly once, on the same
tokens as an uninterrupted run, to the same weights (groups of several processes:
tests/train/test_elastic_groups.py). Not tested: several machines, NCCL, real node failures (the
kill is injected: hlat.faults).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from torchft.coordination import LighthouseServer

from hlat.checkpoint.manager import CheckpointManager
from hlat.errors import UserError
from hlat.metrics.sinks import read_metrics
from hlat.train.elastic.replicas import import_torchft
from runs import checkpoint_tensors, tiny_args, wait_for_shared_launch

GROUPS, STEPS, KILL = 3, 8, 3  # group 1 dies before step KILL and is restarted after step KILL + 1
ELASTIC = [
    "--train.global_batch", "6", "--train.micro_batch", "1", "--train.steps", str(STEPS),
    "--parallel.compile", "false", "--elastic.enabled", "true", "--elastic.max_groups", str(GROUPS),
    "--elastic.timeout_s", "60", "--elastic.secret_env", "HLAT_TEST_RUN_SECRET",
]  # fmt: skip
SECRET = {"HLAT_TEST_RUN_SECRET": secrets.token_hex(32)}  # the run secret of every group these tests start
DEADLINE_S = 300  # a bound for hangs, not a budget


def lighthouse(min_groups: int):
    return LighthouseServer(bind="[::]:0", min_replicas=min_groups, join_timeout_ms=10_000, heartbeat_timeout_ms=1500)


def start_group(corpus: Path, run: Path, server, group: int, min_groups: int, *extra: str, **env: str):
    args = tiny_args(corpus, run / f"group{group}", *ELASTIC, *extra)
    args += ["--elastic.lighthouse", server.address(), "--elastic.group", str(group)]
    args += ["--elastic.min_groups", str(min_groups)]
    log = open(run / f"group{group}.{len(list(run.glob(f'group{group}.*.log')))}.log", "w")
    environ = {**os.environ, "OMP_NUM_THREADS": "1", **SECRET, **env}
    return subprocess.Popen([sys.executable, "-m", "hlat", "train", *args], stdout=log, stderr=log, env=environ)


def records(run: Path) -> list[dict]:
    return [
        json.loads(line) for f in sorted(run.glob("group[012]/tokens.*.jsonl")) for line in f.read_text().splitlines()
    ]


def wait(proc: subprocess.Popen, run: Path) -> None:
    code = proc.wait(timeout=DEADLINE_S)
    assert code == 0, "\n".join(f.read_text()[-3000:] for f in sorted(run.glob("*.log")))


def assert_every_share_once(got: list[dict], want: list[dict], steps: int, shares: int) -> None:
    """Every (step, share) of the data order trained exactly once, on the uninterrupted run's tokens."""
    assert Counter((r["step"], r["share"]) for r in got) == Counter(
        (s, j) for s in range(1, steps + 1) for j in range(shares)
    )
    assert sorted((r["step"], r["share"], r["digest"]) for r in got) == sorted(
        (r["step"], r["share"], r["digest"]) for r in want
    )


def logged_losses(run: Path) -> dict[int, float]:
    """The loss metrics.jsonl holds for each step (train.log_every is 1)."""
    return {r["step"]: r["loss"] for r in read_metrics(run) if "loss" in r}


def final_weights(run: Path, scratch: Path, steps: int = STEPS) -> dict[str, torch.Tensor]:
    path = CheckpointManager(run / "checkpoints", None).latest()
    assert path is not None and path.name == f"step_{steps:08d}", path
    return {k: v for k, v in checkpoint_tensors(path, scratch).items() if k.startswith("model.")}


def test_group_killed_restarted_and_intruder_refused_keep_every_token_once(small_corpus, tmp_path):
    wait_for_shared_launch()
    straight, faulty = tmp_path / "straight", tmp_path / "faulty"
    straight.mkdir()
    faulty.mkdir()
    # the uninterrupted run: one group holding all three shares (the data order does not depend on
    # how many groups are present), beside the faulty run, at a lighthouse of its own
    alone, shared = lighthouse(1), lighthouse(2)
    reference = start_group(small_corpus, straight, alone, 0, 1)
    # all three at step 1; three again at KILL + 2 (the intruder is the third) and at KILL + 3 (group 1)
    hold = {"HLAT_ELASTIC_HOLD": f"1:{GROUPS},{KILL + 2}:{GROUPS},{KILL + 3}:{GROUPS}"}
    fault = {"HLAT_FAULT": f"step:{KILL}:0", "HLAT_FAULT_MARKER": str(tmp_path / "killed")}
    procs = [start_group(small_corpus, faulty, shared, g, 2, **hold, **(fault if g == 1 else {})) for g in range(3)]
    assert procs[1].wait(timeout=DEADLINE_S) == -9, "group 1 was not killed"
    deadline = time.monotonic() + DEADLINE_S
    while not any(r["step"] == KILL + 1 for r in records(faulty)):  # the survivors trained two steps without it
        assert time.monotonic() < deadline and all(p.poll() is None for p in (procs[0], procs[2])), "survivors stopped"
        time.sleep(0.2)
    # while the survivors hold before step KILL + 2, a group whose data differs (one file of a copy of
    # the corpus, elsewhere: only the content is fingerprinted) arrives: it is refused when it would
    # heal from them (the step it joined is retried); then group 1 comes back
    other = shutil.copytree(small_corpus, tmp_path / "other-corpus")
    first = sorted(other.iterdir())[0]
    first.write_text(first.read_text() + "\n# another line\n")
    intruder = start_group(other, faulty, shared, 3, 2)
    assert intruder.wait(timeout=DEADLINE_S) == 2
    refusal = (faulty / "group3.0.log").read_text().strip().splitlines()[-1]
    assert refusal.startswith("hlat train: elastic group 3 refused: its configuration or data"), refusal
    restarted = start_group(small_corpus, faulty, shared, 1, 2, **hold)
    for proc in (procs[0], procs[2], restarted, reference):
        wait(proc, faulty if proc is not reference else straight)
    shared.shutdown()
    alone.shutdown()

    got, want = records(faulty), records(straight)
    assert_every_share_once(got, want, STEPS, GROUPS)
    # who trained what: group 1 before its death and after its restart, the survivors throughout in one process
    by_step = {s: sorted(r["group"] for r in got if r["step"] == s) for s in range(1, STEPS + 1)}
    # (after KILL + 3 who trains which step varies: a group slow to retry a failed step is left out
    # of that step and heals again)
    assert all(by_step[s] == ["0", "1", "2"] for s in (1, 2, KILL + 3)), by_step
    assert all(sorted(set(by_step[s])) == ["0", "2"] for s in (KILL, KILL + 1, KILL + 2)), by_step
    pids = {g: {r["pid"] for r in got if r["group"] == g} for g in "012"}
    assert pids["0"] == {procs[0].pid} and pids["2"] == {procs[2].pid}
    assert pids["1"] == {procs[1].pid, restarted.pid}
    assert any(r["pid"] == restarted.pid and r["step"] == KILL + 3 for r in got)
    assert "rejoined from group" in (faulty / "group1.1.log").read_text()
    assert not (faulty / "group3" / "tokens.3.jsonl").exists()
    # the same weights as the uninterrupted run, to the order of summation (fp32, a few ulps of the 1e-2 weights)
    reference_weights = final_weights(straight / "group0", tmp_path)
    for g in "012":
        weights = final_weights(faulty / f"group{g}", tmp_path)
        assert weights.keys() == reference_weights.keys()
        for key, value in weights.items():
            torch.testing.assert_close(value, reference_weights[key], rtol=0, atol=1e-6, msg=key)


def test_unreachable_lighthouse_is_one_line_error(small_corpus, tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    args = tiny_args(small_corpus, tmp_path / "run", *ELASTIC, "--elastic.lighthouse", f"http://localhost:{port}")
    done = subprocess.run(
        [sys.executable, "-m", "hlat", "train", *args, "--elastic.group", "0"],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env={**os.environ, **SECRET},
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"hlat train: elastic.lighthouse=http://localhost:{port}: no lighthouse answers")
    )
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_elastic_without_torchft_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchft", None)  # as if not installed
    with pytest.raises(UserError, match=r"pip install 'hlat\[elastic\]'"):
        import_torchft()


def test_doctor_checks_the_lighthouse(tmp_path):
    from hlat.commands.preflight import check_lighthouse
    from hlat.config.run import RunConfig

    cfg = RunConfig()
    cfg.elastic.enabled, cfg.elastic.group, cfg.elastic.trusted_network = True, "0", True
    server = lighthouse(1)
    cfg.elastic.lighthouse = server.address()
    answered = check_lighthouse(cfg)
    server.shutdown()
    assert answered.status == "ok" and "torchft 0.2.0" in answered.figure, answered
    with socket.socket() as s:
        s.bind(("localhost", 0))
        cfg.elastic.lighthouse = f"http://localhost:{s.getsockname()[1]}"
    silent = check_lighthouse(cfg)
    assert silent.failed and "no lighthouse answers" in silent.fix, silent


def test_elastic_config_problems_name_the_field():
    from hlat.config.run import RunConfig
    from hlat.errors import ConfigError

    cfg = RunConfig()
    cfg.elastic.enabled, cfg.elastic.max_groups = True, 3
    cfg.train.global_batch, cfg.train.micro_batch = 8, 1
    cfg.recovery.nonfinite = "rollback"
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    fields = [field for field, _ in err.value.problems]
    assert fields == [
        "elastic.lighthouse", "elastic.group", "elastic.secret_file", "train.global_batch", "elastic.enabled"
    ], fields  # fmt: skip
    cfg.recovery.nonfinite, cfg.train.global_batch, cfg.elastic.trusted_network = "skip", 6, True
    cfg.elastic.lighthouse, cfg.elastic.group = "http://localhost:29510", "0"
    cfg.validate()
    # a group of several processes: FSDP2, TP or PP over them (tested: tests/train/test_elastic_groups.py),
    # each share's micro-batches dealt evenly over its dp ranks; tp x FSDP2, pp x FSDP2, CP, HSDP are refused
    assert [field for field, _ in cfg.layout_problems(2)] == ["parallel.dp_sharding"]
    cfg.parallel.tp = 2
    assert cfg.layout_problems(2) == []  # tp over the group: one dp rank, no sharding to choose
    cfg.parallel.dp_sharding = "fsdp"
    assert [field for field, _ in cfg.layout_problems(4)] == ["parallel.tp"]  # tp 2 x FSDP2 2: not yet
    cfg.parallel.tp, cfg.parallel.pp = 1, 2
    assert cfg.layout_problems(2) == []  # pp over the group
    assert [field for field, _ in cfg.layout_problems(4)] == ["parallel.pp"]  # pp 2 x FSDP2 2: not yet
    cfg.parallel.pp = 1
    cfg.parallel.tp = 1
    assert cfg.layout_problems(2) == []
    assert [field for field, _ in cfg.layout_problems(3)] == ["train.global_batch"]  # 6 = 3 shares x 2, not x 3
    cfg.parallel.cp = 2
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    assert [field for field, _ in err.value.problems] == ["elastic.enabled"]
