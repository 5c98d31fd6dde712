"""Elastic runs beyond a killed group (hlat.train.elastic): a group that hangs mid-step, and an
elastic run's checkpoint resumed in other layouts (and the reverse). Replica groups of one process
on gloo on one machine, the lighthouse in this process (the helpers of tests/train/test_elastic.py)
or in the scenario's (tests/train/elastic_runs.py).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from torchft.coordination import LighthouseServer

from hlat.checkpoint.manager import CheckpointManager
from runs import Scenario, ScenarioResults, checkpoint_tensors, wait_for_shared_launch
from test_elastic import final_weights, records, start_group, wait

GROUPS, STEPS, HANG = 3, 6, 3  # group 1 freezes inside step HANG
TIMEOUT_S = 4  # elastic.timeout_s of the hang test
JOIN_MS = 1000  # the lighthouse's join timeout there

# An elastic run of 2 steps (one group holding all of elastic.max_groups data shares) resumed to 4
# without [elastic] on as many data-parallel ranks as shares, beside the uninterrupted run; and the
# reverse: a run without [elastic] resumed as one elastic group.
TRAIN, ELASTIC_TRAIN = "train/layout_runs.py:train", "train/elastic_runs.py:elastic"
EVERY = ["--checkpoint.every", "2"]
RESUMED = {"steps": 4, "extra": EVERY, "resume": "require"}
SCENARIOS = [
    s
    for dp in (1, 2)
    for s in (
        Scenario(f"elastic-dp{dp}-straight", TRAIN, dp, {"steps": 4, "extra": EVERY}),
        Scenario(f"elastic-dp{dp}-first", ELASTIC_TRAIN, 1, {"steps": 2, "shares": dp, "extra": EVERY}),
        Scenario(f"elastic-dp{dp}-resumed", TRAIN, dp, {**RESUMED, "start_from": f"elastic-dp{dp}-first"}),
    )
] + [
    Scenario("elastic-from-dp2-first", TRAIN, 2, {"steps": 2, "extra": EVERY}),
    Scenario(
        "elastic-from-dp2-resumed",
        ELASTIC_TRAIN,
        1,
        {"steps": 4, "shares": 2, "extra": EVERY, "resume": "require", "start_from": "elastic-from-dp2-first"},
    ),
]


def test_hung_group_is_dropped_after_the_timeout_and_every_token_trained_once(small_corpus, tmp_path):
    """Group 1 of three freezes inside step HANG, after the step's quorum and data exchange, before
    its first all-reduce (alive but silent, like a stuck node). elastic.timeout_s bounds how long
    the others' all-reduce waits for it: then step HANG does not commit and is retried by groups 0
    and 2, on the same data. The frozen group's torchft manager still heartbeats, so the lighthouse
    counts it as healthy: every later quorum waits the lighthouse's join timeout for it, then goes
    on without it, because the two that join are more than half of the three heartbeating. (With
    two groups one survivor is not more than half: its quorum times out after elastic.timeout_s.)
    """
    wait_for_shared_launch()
    straight, faulty = tmp_path / "straight", tmp_path / "faulty"
    straight.mkdir()
    faulty.mkdir()
    extra = ("--elastic.max_groups", str(GROUPS), "--elastic.timeout_s", str(TIMEOUT_S), "--train.steps", str(STEPS))
    alone, shared = (
        LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=JOIN_MS, heartbeat_timeout_ms=1500)
        for _ in range(2)
    )
    reference = start_group(small_corpus, straight, alone, 0, 1, *extra)
    hold = {"HLAT_ELASTIC_HOLD": f"1:{GROUPS}"}  # all three train from step 1
    fault = {"HLAT_FAULT": f"hang-compute:{HANG}:0", "HLAT_FAULT_MARKER": str(tmp_path / "froze")}
    procs = [
        start_group(small_corpus, faulty, shared, g, 1, *extra, **hold, **(fault if g == 1 else {}))
        for g in range(GROUPS)
    ]
    try:
        wait(procs[0], faulty)
        wait(procs[2], faulty)
        wait(reference, straight)
        assert procs[1].poll() is None, "the hung group exited"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shared.shutdown()
        alone.shutdown()
    assert (tmp_path / "froze").exists()

    got, want = records(faulty), records(straight)
    assert Counter((r["step"], r["share"]) for r in got) == Counter(
        (s, j) for s in range(1, STEPS + 1) for j in range(GROUPS)
    )
    assert sorted((r["step"], r["share"], r["digest"]) for r in got) == sorted(
        (r["step"], r["share"], r["digest"]) for r in want
    )
    by_step = {s: sorted(r["group"] for r in got if r["step"] == s) for s in range(1, STEPS + 1)}
    assert all(by_step[s] == ["0", "1", "2"] for s in range(1, HANG)), by_step
    assert all(set(by_step[s]) == {"0", "2"} for s in range(HANG, STEPS + 1)), by_step
    for g in (0, 2):
        assert {r["pid"] for r in got if r["group"] == str(g)} == {procs[g].pid}
        log = (faulty / f"group{g}.0.log").read_text()
        assert f"elastic: step {HANG} did not commit" in log, log[-3000:]
        assert f"elastic: 2 group(s) present at step {HANG}" in log, log[-3000:]
    reference_weights = final_weights(straight / "group0", tmp_path, STEPS)
    for g in (0, 2):
        for key, value in final_weights(faulty / f"group{g}", tmp_path, STEPS).items():
            torch.testing.assert_close(value, reference_weights[key], rtol=0, atol=1e-6, msg=key)


def _final(scenarios: ScenarioResults, name: str, scratch: Path) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The model weights of scenario `name`'s last checkpoint (step 4) and its ranks' loader states."""
    manager = CheckpointManager(scenarios.path(name) / "run" / "checkpoints", None)
    path = manager.latest()
    assert path is not None and path.name == "step_00000004", path
    ranks = sorted(int(f.stem.removeprefix("rank_")) for f in path.glob("rank_*.pt"))
    return (
        {k: v for k, v in checkpoint_tensors(path, scratch).items() if k.startswith("model.")},
        [manager.load_rank_state(path, r)["loader"] for r in ranks],
    )


@pytest.mark.parametrize("first", ["elastic-dp1", "elastic-dp2", "elastic-from-dp2"])
def test_elastic_checkpoint_resumes_in_another_layout_exactly(scenarios: ScenarioResults, tmp_path, first):
    """Steps 3-4 read the uninterrupted run's data (the same losses and data positions), to the
    same weights up to the order of summation (the elastic steps sum each share's gradients in one
    process and then over the groups; data parallelism sums per rank then across ranks)."""
    straight = "elastic-dp2-straight" if first == "elastic-from-dp2" else f"{first}-straight"
    want, got = (scenarios.json(name, "summary.rank0.json") for name in (straight, f"{first}-resumed"))
    assert any("resuming from" in m and "step_00000002" in m for m in got["messages"]), got["messages"]
    torch.testing.assert_close(got["losses"], want["losses"][2:], rtol=1e-5, atol=0)
    (want_weights, want_loaders), (weights, loaders) = (
        _final(scenarios, straight, tmp_path),
        _final(scenarios, f"{first}-resumed", tmp_path),
    )
    if first == "elastic-from-dp2":  # one elastic group saves its shares' positions merged
        loaders = loaders[0]["ranks"]
    assert loaders == want_loaders
    assert weights.keys() == want_weights.keys()
    for key, value in weights.items():
        torch.testing.assert_close(value, want_weights[key], rtol=0, atol=1e-6, msg=key)
