"""Two torchrun "nodes" on this machine rendezvous over 127.0.0.1 (c10d) and train together."""

from runs import Scenario, ScenarioResults

# the two launches start from the shared launch (tests/parallel/multinode_runs.py)
SCENARIOS = [Scenario("two-nodes", "parallel/multinode_runs.py:two_nodes")]


def test_two_nodes_rendezvous_and_train(scenarios: ScenarioResults):
    done = scenarios.json("two-nodes", "result.json")
    assert done["returncode"] == 0, done["stdout"][-2000:] + done["stderr"][-4000:]
    assert "on 2 x cpu (pp 1 x dp 2 x tp 1" in done["stdout"] and "done: step 2" in done["stdout"]
