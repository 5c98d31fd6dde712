"""Elastic runs under the faults a kill does not cover (hlat.train.elastic): a group that hangs
mid-step. Replica groups of one process on gloo on one machine, the lighthouse in this process
(the helpers of tests/train/test_elastic.py).
"""

from __future__ import annotations

from collections import Counter

import torch
from torchft.coordination import LighthouseServer

from runs import wait_for_shared_launch
from test_elastic import final_weights, records, start_group, wait

GROUPS, STEPS, HANG = 3, 6, 3  # group 1 freezes inside step HANG
TIMEOUT_S = 4  # elastic.timeout_s of the hang test
JOIN_MS = 1000  # the lighthouse's join timeout there


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
