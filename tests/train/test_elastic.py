"""Elastic data parallelism on torchft (hlat.train.elastic): replica groups of one process each,
on gloo on one machine, started with their lighthouse from a scenario of the shared launch
(tests/train/elastic_runs.py). A group killed (SIGKILL) mid-run drops out, the survivors go on
in the same processes, the group restarted two steps later rejoins from a live peer; every
(step, share) of the data order is trained exactly once, on the same tokens as an uninterrupted
run, to the same weights (groups of several processes: tests/train/test_elastic_groups.py). Not
tested: several machines, NCCL, real node failures (the kill is injected: hlat.faults).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from elastic_runs import DEADLINE_S, ELASTIC, GROUPS, KILL, SECRET, STEPS, lighthouse, records
from hlat.checkpoint.manager import CheckpointManager
from hlat.errors import UserError
from hlat.metrics.sinks import read_metrics
from hlat.train.elastic.replicas import import_torchft
from runs import Scenario, ScenarioResults, assert_weights_match, checkpoint_tensors, tiny_args

# the groups start from the shared launch, where their waiting runs beside other tests
SCENARIOS = [Scenario("elastic-killed-restarted", "train/elastic_runs.py:killed_restarted", waiting=True)]


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


def test_group_killed_restarted_and_intruder_refused_keep_every_token_once(scenarios: ScenarioResults, tmp_path):
    """Group 1 of three killed before step KILL (its death, the survivors' two steps without it, the
    refusal of an intruder whose data differs: asserted as elastic_runs.killed_restarted runs them),
    restarted after KILL + 1 and back from step KILL + 3; one group holding all three shares trained the same steps uninterrupted beside them."""
    out = scenarios.path("elastic-killed-restarted")
    straight, faulty = out / "straight", out / "faulty"
    started = scenarios.json("elastic-killed-restarted", "pids.json")
    procs, restarted = started["groups"], started["restarted"]

    got, want = records(faulty), records(straight)
    assert_every_share_once(got, want, STEPS, GROUPS)
    # who trained what: group 1 before its death and after its restart, the survivors throughout in one process
    by_step = {s: sorted(r["group"] for r in got if r["step"] == s) for s in range(1, STEPS + 1)}
    # (after KILL + 3 who trains which step varies: a group slow to retry a failed step is left out
    # of that step and heals again)
    assert all(by_step[s] == ["0", "1", "2"] for s in (1, 2, KILL + 3)), by_step
    assert all(sorted(set(by_step[s])) == ["0", "2"] for s in (KILL, KILL + 1, KILL + 2)), by_step
    pids = {g: {r["pid"] for r in got if r["group"] == g} for g in "012"}
    assert pids["0"] == {procs[0]} and pids["2"] == {procs[2]}
    assert pids["1"] == {procs[1], restarted}
    assert any(r["pid"] == restarted and r["step"] == KILL + 3 for r in got)
    assert "rejoined from group" in (faulty / "group1.1.log").read_text()
    assert not (faulty / "group3" / "tokens.3.jsonl").exists()
    # the same weights as the uninterrupted run, to the order of summation
    reference_weights = final_weights(straight / "group0", tmp_path)
    for g in "012":
        assert_weights_match(final_weights(faulty / f"group{g}", tmp_path), reference_weights)


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
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
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
