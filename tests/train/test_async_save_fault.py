"""kill -9 during an asynchronous (background) checkpoint save, under torchrun --max-restarts: the
save in flight is never committed, the restarted group resumes from the previous checkpoint, and
the final weights and Adam moments equal the uninterrupted run's bit for bit (2 gloo processes)."""

from hlat.checkpoint.manager import CheckpointManager
from runs import Scenario, ScenarioResults, assert_same_tensors, checkpoint_tensors, launch, tiny_args

ASYNC = ["--checkpoint.every", "2", "--checkpoint.async_save", "true"]
SCENARIOS = [Scenario("async-straight", "train/layout_runs.py:train", 2, {"steps": 6, "extra": ASYNC})]


def test_kill_during_background_save_resumes_from_the_previous_checkpoint(
    scenarios: ScenarioResults, small_corpus, tmp_path
):
    faulty, marker = tmp_path / "faulty", tmp_path / "fault-done"
    env = {"HLAT_FAULT": "writing:4:1", "HLAT_FAULT_MARKER": str(marker)}  # rank 1, while step 4's save is written
    out = launch(2, tiny_args(small_corpus, faulty, "--train.steps", "6", *ASYNC), env=env, restarts=2).stdout
    assert marker.read_text() == "killed rank 1 at writing 4\n"
    # step 4's save was never committed: the restarted group resumed from step 2
    assert "resuming from" in out and "step_00000002" in out, out[-2000:]
    final = [
        CheckpointManager(run / "checkpoints", None).latest()
        for run in (scenarios.path("async-straight") / "run", faulty)
    ]
    assert [p.name for p in final] == ["step_00000006"] * 2
    assert_same_tensors(checkpoint_tensors(final[1], tmp_path), checkpoint_tensors(final[0], tmp_path))
