"""A rank that stops answering (alive, silent) makes the others fail with an error that names it."""

import pytest

from hlat.parallel.hang import _missing, _ranks, is_timeout
from runs import Scenario, ScenarioResults

# the launch of its own runs from the shared launch, where its timeout waits beside other tests
SCENARIOS = [Scenario("hang-stuck-rank", "parallel/hang_runs.py:stuck_rank", waiting=True)]


def test_stuck_rank_is_named_with_the_step_and_phase(scenarios: ScenarioResults):
    out = scenarios.path("hang-stuck-rank")
    done = scenarios.json("hang-stuck-rank", "result.json")
    assert (out / "fault-done").is_file(), "the fault never fired"
    assert done["returncode"] != 0
    assert "CollectiveTimeout: step 3, training step" in done["stderr"], done["stderr"][-4000:]
    assert "rank 1 never arrived within 10 s; rank 0 waited" in done["stderr"], done["stderr"][-4000:]
    assert done["elapsed"] < 120


class FakeStore:
    def __init__(self, keys):
        self.keys = set(keys)
        self.requests = 0

    def check(self, keys):
        self.requests += 1
        return set(keys) <= self.keys


def test_missing_ranks_are_found_by_bisection_in_few_requests():
    store = FakeStore(str(r) for r in range(1024) if r not in (5, 700))
    assert _missing(store, list(range(1024))) == [5, 700]
    assert store.requests < 50
    assert _ranks([3]) == "rank 3" and _ranks([0, 2]) == "ranks [0, 2]"


@pytest.mark.parametrize(
    "message, expected",
    [
        ("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete", True),
        ("Connection closed by peer", False),
    ],
)
def test_timeouts_are_told_from_other_errors(message, expected):
    assert is_timeout(RuntimeError(message)) is expected
