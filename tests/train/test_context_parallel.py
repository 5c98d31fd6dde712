"""`hlat train` with context parallelism: cp 2 trains the tiny model to the single process's
gradient norms, optimizer moments and weights, and its checkpoint resumes at cp 1 and cp 4,
continuing the single process's losses."""

import json

import pytest

from runs import Scenario, ScenarioResults, assert_weights_match, checkpoint_tensors

# Measured (fp32, cp 2 against one process, after 2 steps): AdamW's exp_avg and exp_avg_sq within
# 5.6e-7 of their largest element, the weights within runs.ORDER_OF_SUMMATION_ATOL, the losses within
# 1.5e-7 relative, the gradient norms equal. A few times that: RoPE positions of the wrong cp rank (the
# losses move 6.4e-6, the moments far more) and gradients averaged over dp instead of dp x cp (the
# losses barely move: AdamW undoes the scale; the norms and exp_avg halve) both fail it.
TOLERANCE = 2e-6

TRAIN = "train/layout_runs.py:train"
EVERY_2 = ["--checkpoint.every", "2"]  # step 2's checkpoint of either run is compared
SCENARIOS = [
    Scenario("cp-1", TRAIN, 1, {"steps": 4, "extra": EVERY_2}),
    Scenario("cp-2-first", TRAIN, 2, {"steps": 2, "extra": ["--parallel.cp", "2", *EVERY_2]}),
    Scenario("cp-2-resumed-at-cp-1", TRAIN, 1, {"steps": 4, "resume": "require", "start_from": "cp-2-first"}),
    Scenario(
        "cp-2-resumed-at-cp-4",
        TRAIN,
        4,
        {"steps": 4, "extra": ["--parallel.cp", "4"], "resume": "require", "start_from": "cp-2-first"},
    ),
]


def _grad_norms(scenarios: ScenarioResults, name: str) -> list[float]:
    lines = (scenarios.path(name) / "run" / "metrics.jsonl").read_text().splitlines()
    return [record["grad_norm"] for record in map(json.loads, lines) if "grad_norm" in record]


def test_context_parallel_trains_as_one_process(scenarios: ScenarioResults, tmp_path) -> None:
    one, two = (scenarios.json(name, "summary.rank0.json") for name in ("cp-1", "cp-2-first"))
    assert len(one["losses"]) == 4 and len(two["losses"]) == 2
    assert two["losses"] == pytest.approx(one["losses"][:2], rel=TOLERANCE)
    assert scenarios.json("cp-2-first", "summary.rank1.json")["losses"] == two["losses"]  # one loss for the cp group
    assert _grad_norms(scenarios, "cp-2-first") == pytest.approx(_grad_norms(scenarios, "cp-1")[:2], rel=TOLERANCE)
    expected, got = (
        checkpoint_tensors(scenarios.path(name) / "run" / "checkpoints" / "step_00000002", tmp_path)
        for name in ("cp-1", "cp-2-first")
    )
    assert expected.keys() == got.keys()
    weights = [key for key in expected if key.startswith("model.")]
    assert_weights_match({k: got[k] for k in weights}, {k: expected[k] for k in weights})
    for key in expected.keys() - weights:  # AdamW's moments: a gradient's error, not amplified
        want = expected[key].double()
        error = (got[key].double() - want).abs().max().item()
        assert error <= TOLERANCE * want.abs().max().item(), f"{key}: off by {error:.3g}"


@pytest.mark.parametrize("cp", [1, 4])
def test_context_parallel_checkpoint_resumes_at_another_cp(scenarios: ScenarioResults, cp: int) -> None:
    one, first, resumed = (
        scenarios.json(name, "summary.rank0.json") for name in ("cp-1", "cp-2-first", f"cp-2-resumed-at-cp-{cp}")
    )
    assert any("resuming from" in m and "step_00000002" in m for m in resumed["messages"]), resumed["messages"]
    assert first["losses"] + resumed["losses"] == pytest.approx(one["losses"], rel=1e-5)
    assert resumed["tokens_emitted"] == one["tokens_emitted"]  # the loader continued where it stopped
