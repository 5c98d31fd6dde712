"""`hlat train` with context parallelism: cp 2 trains the tiny model to the single process's
losses (fp32, 1e-5 relative; the largest difference measured was 1.5e-7 relative), and its
checkpoint resumes at cp 1, continuing the single process's losses."""

import pytest

from runs import Scenario, ScenarioResults

TRAIN = "train/layout_runs.py:train"
CP2 = ["--parallel.cp", "2", "--checkpoint.every", "2"]
SCENARIOS = [
    Scenario("cp-1", TRAIN, 1, {"steps": 4}),
    Scenario("cp-2-first", TRAIN, 2, {"steps": 2, "extra": CP2}),
    Scenario("cp-2-resumed-at-cp-1", TRAIN, 1, {"steps": 4, "resume": "require", "start_from": "cp-2-first"}),
    Scenario(
        "cp-2-resumed-at-cp-4",
        TRAIN,
        4,
        {"steps": 4, "extra": ["--parallel.cp", "4"], "resume": "require", "start_from": "cp-2-first"},
    ),
]


def test_context_parallel_losses_match_one_process(scenarios: ScenarioResults) -> None:
    one, two = (scenarios.json(name, "summary.rank0.json") for name in ("cp-1", "cp-2-first"))
    assert len(one["losses"]) == 4 and len(two["losses"]) == 2
    assert two["losses"] == pytest.approx(one["losses"][:2], rel=1e-5)
    assert scenarios.json("cp-2-first", "summary.rank1.json")["losses"] == two["losses"]  # one loss for the cp group


@pytest.mark.parametrize("cp", [1, 4])
def test_context_parallel_checkpoint_resumes_at_another_cp(scenarios: ScenarioResults, cp: int) -> None:
    one, first, resumed = (
        scenarios.json(name, "summary.rank0.json") for name in ("cp-1", "cp-2-first", f"cp-2-resumed-at-cp-{cp}")
    )
    assert any("resuming from" in m and "step_00000002" in m for m in resumed["messages"]), resumed["messages"]
    assert first["losses"] + resumed["losses"] == pytest.approx(one["losses"], rel=1e-5)
    assert resumed["tokens_emitted"] == one["tokens_emitted"]  # the loader continued where it stopped
