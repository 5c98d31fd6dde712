"""Resuming under tensor and pipeline parallelism continues the uninterrupted run exactly: the
same per-step losses and bit-identical weights and Adam moments at the end (4 gloo processes,
tiny model, 2 steps + 2 resumed steps against 4 straight)."""

import json

import pytest

from hlat.checkpoint.manager import CheckpointManager
from runs import Scenario, ScenarioResults, assert_same_tensors, checkpoint_tensors

TRAIN = "train/layout_runs.py:train"
LAYOUTS = {
    "tp2xdp2": ["--parallel.tp", "2", "--parallel.dp_sharding", "zero2"],
    "pp2xdp2": ["--parallel.pp", "2", "--parallel.dp_sharding", "fsdp"],
}
EVERY = ["--checkpoint.every", "2"]
SCENARIOS = [
    s
    for name, layout in LAYOUTS.items()
    for s in (
        Scenario(f"{name}-straight", TRAIN, 4, {"steps": 4, "extra": [*layout, *EVERY]}),
        Scenario(f"{name}-first", TRAIN, 4, {"steps": 2, "extra": [*layout, *EVERY]}),
        Scenario(
            f"{name}-resumed",
            TRAIN,
            4,
            {"steps": 4, "extra": [*layout, *EVERY], "resume": "require", "start_from": f"{name}-first"},
        ),
    )
]


@pytest.mark.parametrize("name", LAYOUTS)
def test_resume_matches_the_uninterrupted_run(scenarios: ScenarioResults, tmp_path, name):
    straight, first, resumed = (
        scenarios.json(f"{name}-{part}", "summary.rank0.json") for part in ("straight", "first", "resumed")
    )
    assert len(straight["losses"]) == 4 and first["step"] == 2 and resumed["step"] == 4
    assert any("resuming from" in m and "step_00000002" in m for m in resumed["messages"]), resumed["messages"]
    assert first["losses"] + resumed["losses"] == straight["losses"]  # bit-identical, step by step
    runs = [scenarios.path(f"{name}-{part}") / "run" for part in ("straight", "resumed")]
    final = [CheckpointManager(run / "checkpoints", None).latest() for run in runs]
    assert [p.name for p in final] == ["step_00000004"] * 2
    tensors = [checkpoint_tensors(p, tmp_path) for p in final]
    assert any(".exp_avg_sq" in k for k in tensors[0])
    assert_same_tensors(tensors[1], tensors[0])
    # metrics.jsonl of the resumed run continues the first: steps 1-4, each once
    steps = [json.loads(line)["step"] for line in (runs[1] / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
