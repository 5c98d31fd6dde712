"""kill -9 during an asynchronous (background) checkpoint save, under torchrun --max-restarts: the
save in flight is never committed, the restarted group resumes from the previous checkpoint, and
the final weights and Adam moments equal the uninterrupted run's bit for bit (2 gloo processes)."""

from hlat.checkpoint.manager import CheckpointManager
from runs import Scenario, ScenarioResults, assert_same_tensors, checkpoint_tensors

ASYNC = ["--checkpoint.every", "2", "--checkpoint.async_save", "true"]
FAULT = {"HLAT_FAULT": "writing:4:1", "HLAT_FAULT_MARKER": "{out}/fault-done"}  # rank 1, while step 4's save is written
SCENARIOS = [
    Scenario("async-straight", "train/layout_runs.py:train", 2, {"steps": 6, "extra": ASYNC}),
    # a launch of its own (kill and restart), started from the shared launch (tests/launch_runs.py)
    Scenario(
        "async-killed",
        "launch_runs.py:hlat_train",
        kwargs={"nproc": 2, "extra": ["--train.steps", "6", *ASYNC], "env": FAULT, "restarts": 2},
    ),
]


def test_kill_during_background_save_resumes_from_the_previous_checkpoint(scenarios: ScenarioResults, tmp_path):
    killed = scenarios.path("async-killed")
    done = scenarios.json("async-killed", "result.json")
    assert done["returncode"] == 0, done["stdout"][-3000:] + done["stderr"][-5000:]
    out = done["stdout"]
    assert (killed / "fault-done").read_text() == "killed rank 1 at writing 4\n"
    # step 4's save was never committed: the restarted group resumed from step 2
    assert "resuming from" in out and "step_00000002" in out, out[-2000:]
    final = [
        CheckpointManager(run / "checkpoints", None).latest()
        for run in (scenarios.path("async-straight") / "run", killed / "run")
    ]
    assert [p.name for p in final] == ["step_00000006"] * 2
    assert_same_tensors(checkpoint_tensors(final[1], tmp_path), checkpoint_tensors(final[0], tmp_path))
