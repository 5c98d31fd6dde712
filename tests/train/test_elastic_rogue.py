"""A rogue at an elastic run's lighthouse (hlat.train.elastic: the run secret, the member check,
the authenticated state transfer): a process written with torchft, knowing the lighthouse's
address but not the run secret, joins four times while two groups train; it (d) sits at the
groups' step and sends garbage for the member check and a huge share length, (a) asks for a
group's state, (b) offers zeroed weights from a higher step, (c) claims step 10^6 with another
fingerprint. Nothing of a group is read or replaced: the groups train every step with the
uninterrupted run's losses, tokens and weights, exit 0, and their logs name the rogue. Meanwhile
nothing of a group or the lighthouse listens on every interface but the one socket the group's log
names (torchft's manager server). One process per group and the rogue, on gloo on loopback, the
lighthouse in the process of a scenario of the shared launch (tests/train/elastic_rogue_runs.py,
which asserts the sockets mid-run and that no file of a group holds the secret)."""

from __future__ import annotations

import pytest

from elastic_rogue_runs import ATTACKS, GROUPS, STEPS
from elastic_runs import records
from runs import Scenario, ScenarioResults, assert_weights_match
from test_elastic import assert_every_share_once, final_weights, logged_losses

# the groups and the rogue start from the shared launch, where their waiting runs beside other tests
ROGUE = "elastic-rogue"
SCENARIOS = [Scenario(ROGUE, "train/elastic_rogue_runs.py:rogue", waiting=True)]


def test_a_rogue_without_the_secret_changes_nothing(scenarios: ScenarioResults, tmp_path):
    """The runs, and what must hold while they run: elastic_rogue_runs.rogue."""
    out = scenarios.path(ROGUE)
    straight, faulty = out / "straight", out / "faulty"

    said = (out / "rogue.log").read_text()
    assert said.count("rogue: loaded nothing") == len(ATTACKS), said[-3000:]
    got, want = records(faulty), records(straight)
    assert_every_share_once(got, want, STEPS, GROUPS)
    assert {r["group"] for r in got} == {"0", "1"}
    want_losses = logged_losses(straight / "group0")
    for g in range(GROUPS):
        for step, loss in logged_losses(faulty / f"group{g}").items():
            assert loss == pytest.approx(want_losses[step], rel=1e-5), (g, step)
    reference_weights = final_weights(straight / "group0", tmp_path, STEPS)
    for g in range(GROUPS):
        assert_weights_match(final_weights(faulty / f"group{g}", tmp_path, STEPS), reference_weights)
    logs = "\n".join(f.read_text() for f in sorted(faulty.glob("group*.log")))
    assert "calling itself 'rogue-d') cannot prove the run secret" in logs, logs[-5000:]  # (d)
    assert "refused this group's state to 127.0.0.1" in logs, logs[-5000:]  # (a)
    assert "did not heal from http://127.0.0.1:" in logs and "cannot prove the run secret" in logs  # (b), (c)
