"""Elastic replica groups of several processes (hlat.train.elastic): two groups of two ranks, each a
torchrun job running FSDP2 over its ranks, on gloo on one machine, started with the lighthouses
from a scenario of the shared launch (tests/train/elastic_group_runs.py). One rank of a group
killed (SIGKILL) mid-run takes its group down (torchrun ends the other rank); the survivors go on in the same processes, the group restarted two steps later
rejoins, each rank from the same rank of the live group; every (step, share) of the data order is
trained exactly once, on the same tokens as an uninterrupted run, to the same weights. Beside
them, uninterrupted, two groups of tp 2 and one group of pp 2 holding both shares train the same
tokens to the same losses and weights. Not tested: several machines, NCCL, tp or pp x FSDP2,
CP/HSDP inside a group, a tp or pp group killed, real node failures.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch

from elastic_group_runs import GROUPS, KILL, STEPS, records
from hlat.train.elastic.shares import ElasticData
from runs import Scenario, ScenarioResults, assert_weights_match
from test_elastic import assert_every_share_once, final_weights

# the groups start from the shared launch, where their waiting runs beside other tests
KILLED = "elastic-groups-killed-restarted"
SCENARIOS = [Scenario(KILLED, "train/elastic_group_runs.py:killed_restarted", waiting=True)]


def test_group_of_two_ranks_killed_and_restarted_keeps_every_token_once(scenarios: ScenarioResults, tmp_path):
    """The runs and what must hold while they run (the killed group's ranks all gone, the survivor
    training on): elastic_group_runs.killed_restarted."""
    out = scenarios.path(KILLED)
    straight, faulty, tp, pp = (out / name for name in ("straight", "faulty", "tp", "pp"))
    started = scenarios.json(KILLED, "pids.json")
    dead, survivors = set(started["dead"]), set(started["survivors"])

    got, want = records(faulty), records(straight)
    assert_every_share_once(got, want, STEPS, GROUPS)
    by_step = {s: sorted(r["group"] for r in got if r["step"] == s) for s in range(1, STEPS + 1)}
    assert all(by_step[s] == ["0", "1"] for s in (1, 2, KILL + 2)), by_step
    assert all(by_step[s] == ["0", "0"] for s in (KILL, KILL + 1)), by_step
    # the survivor in the same processes throughout (torchrun restarts nothing: --max-restarts 0)
    pids = {g: {r["pid"] for r in got if r["group"] == g} for g in "01"}
    assert len(pids["0"]) == 1 and pids["0"] <= survivors, (pids, survivors)
    assert len(pids["1"]) == 2 and any(r["step"] == KILL + 2 and r["pid"] not in dead for r in got)
    assert (faulty / "group1.1.log").read_text().count("rejoined from group 0") == 1  # rank 0 logs it
    # the same losses as the uninterrupted run, and the tokens of every share (every group's) counted once
    logged = {
        g: [json.loads(line) for line in (faulty / g / "metrics.jsonl").read_text().splitlines()]
        for g in ("group0", "group1")
    }
    reference_log = [json.loads(line) for line in (straight / "group0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged["group0"]] == list(range(1, STEPS + 1))
    for record in logged["group0"] + logged["group1"]:
        want_record = reference_log[record["step"] - 1]
        assert abs(record["loss"] - want_record["loss"]) < 1e-5, (record, want_record)
        assert sum(record["source_tokens"].values()) == record["tokens"] == want_record["tokens"], record
    # the same weights as the uninterrupted run, to the order of summation (fp32)
    reference_weights = final_weights(straight / "group0", tmp_path, STEPS)
    for g in "01":
        assert_weights_match(final_weights(faulty / f"group{g}", tmp_path, STEPS), reference_weights)
    for run, groups in ((tp, "01"), (pp, "0")):
        check_model_parallel_groups(run, groups, want, reference_log, reference_weights, tmp_path)


def check_model_parallel_groups(
    run: Path, groups: str, want: list[dict], reference_log: list[dict], reference_weights, scratch
):
    """Groups of tp 2 or pp 2 train what one group of FSDP2 over two ranks does: all ranks of a group
    read the same micro-batches (the group's one dp rank), each rank's gradient shards are summed with
    the same rank of the other group, and one rank per group records its shares."""
    got = records(run)
    assert sorted((r["step"], r["share"], r["digest"]) for r in got) == sorted(
        (r["step"], r["share"], r["digest"]) for r in want
    )  # every (step, share) once, on the uninterrupted run's tokens
    by_step = [sorted(r["group"] for r in got if r["step"] == s) for s in range(1, STEPS + 1)]
    assert all(g == sorted(groups * (GROUPS // len(groups))) for g in by_step), by_step
    for g in groups:
        for record in [json.loads(line) for line in (run / f"group{g}" / "metrics.jsonl").read_text().splitlines()]:
            want_record = reference_log[record["step"] - 1]
            assert abs(record["loss"] - want_record["loss"]) < 1e-5, (record, want_record)
            assert sum(record["source_tokens"].values()) == record["tokens"] == want_record["tokens"], record
        # tp, pp and FSDP2 sum in different orders, within the matmuls too
        assert_weights_match(final_weights(run / f"group{g}", scratch, STEPS), reference_weights, atol=1e-5)


class _Loader:
    """A share's loader: micro-batch i of share j holds the token j * 100 + i."""

    docs: list = []

    def __init__(self, share: int):
        self.share, self.read = share, 0

    def next_batch(self) -> SimpleNamespace:
        self.read += 1
        return SimpleNamespace(tokens=torch.tensor([self.share * 100 + self.read - 1]))

    def state_dict(self) -> dict:
        return {"read": self.read}

    def load_state_dict(self, state: dict) -> None:
        self.read = state["read"]

    def close(self) -> None:
        pass


class _AloneReplicas:
    """The only group present: sums are the values themselves."""

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def failed(self) -> bool:
        return False


def test_a_groups_ranks_split_each_share_and_rank_0_records(tmp_path):
    got = {}
    for rank in (0, 1):
        data = ElasticData(_Loader, 2, 4, tmp_path / "tokens.jsonl", rank, 2, records=rank == 0)
        for step in (1, 2):
            got[rank, step] = [int(b.tokens) for b in data.batches(0, 1, _AloneReplicas())]
            data.finish(True, step, "0")
    # each share's four micro-batches of a step dealt over the two ranks, the group holding both shares
    assert got[0, 1] == [0, 2, 100, 102] and got[1, 1] == [1, 3, 101, 103]
    assert got[0, 2] == [4, 6, 104, 106] and got[1, 2] == [5, 7, 105, 107]
    lines = (tmp_path / "tokens.jsonl").read_text().splitlines()
    assert [(r["step"], r["share"]) for r in map(json.loads, lines)] == [(1, 0), (1, 1), (2, 0), (2, 1)]
