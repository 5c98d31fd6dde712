"""Failures: a rank killed (SIGKILL) during training or while a checkpoint is being committed,
under torchrun --max-restarts; a NaN gradient; a loss spike. Injected with hlat.checkpoint.faults
(HLAT_FAULT) or by patching one step in-process.
"""

import json

import pytest
import torch

from hlat.checkpoint import CheckpointManager
from hlat.config import load_config
from hlat.train.trainer import Trainer

from runs import assert_same_tensors, checkpoint_tensors, launch, tiny_args

STEPS = ["--train.steps", "6", "--checkpoint.every", "2"]


@pytest.mark.parametrize("fault", ["step:4:1", "commit:4:0"], ids=["kill-rank1-training", "kill-rank0-committing"])
def test_killed_rank_restarts_and_matches_uninterrupted_run(small_corpus, tmp_path, fault):
    straight = tmp_path / "straight"
    launch(2, tiny_args(small_corpus, straight, *STEPS))
    faulty = tmp_path / "faulty"
    marker = tmp_path / "fault-done"
    env = {"HLAT_FAULT": fault, "HLAT_FAULT_MARKER": str(marker)}
    out = launch(2, tiny_args(small_corpus, faulty, *STEPS), env=env, restarts=2)
    assert marker.is_file(), "the fault never fired"
    # step 4's checkpoint was never committed (or never started): the restart resumed from step 2
    assert "resuming from" in out.stdout and "step_00000002" in out.stdout, out.stdout[-2000:]
    final = [CheckpointManager(run / "checkpoints", None).latest() for run in (straight, faulty)]
    assert final[0].name == final[1].name == "step_00000006"
    assert_same_tensors(checkpoint_tensors(final[1], tmp_path), checkpoint_tensors(final[0], tmp_path))


def cfg(corpus, run, *extra):
    return load_config("tiny", None, tiny_args(corpus, run, *STEPS, *extra))


def quiet(_: str) -> None:
    pass


def _optimizer_state(trainer: Trainer) -> list[torch.Tensor]:
    return [t.clone() for opt in trainer.optimizers.optimizers for state in opt.state.values() for t in state.values()]


@pytest.mark.parametrize("mode", ["fp32", "bf16-sr"])
def test_nonfinite_gradient_step_is_skipped_exactly(small_corpus, tmp_path, monkeypatch, mode):
    """Step 3 gets a NaN gradient: weights, moments and step counts after it equal those before it."""
    run = tmp_path / mode
    trainer = Trainer(cfg(small_corpus, run, "--precision.mode", mode, "--precision.compile_optimizer", "false"), out=quiet)
    real = trainer.model.forward_backward
    snapshots = []

    def forced_nan(batches, n_targets):
        if len(snapshots) < 2 and trainer.step in (2, 3):  # the state before and after step 3
            snapshots.append(([p.detach().clone() for p in trainer.model.parameters()], _optimizer_state(trainer)))
        share = real(batches, n_targets)
        if trainer.step == 2:  # running step 3: a NaN in one gradient entry
            next(p for p in trainer.model.parameters() if p.grad is not None).grad.view(-1)[0] = float("nan")
        return share

    monkeypatch.setattr(trainer.model, "forward_backward", forced_nan)
    summary = trainer.fit()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_steps"] for r in records] == [0, 0, 1, 1, 1, 1]
    (weights_before, state_before), (weights_after, state_after) = snapshots
    assert_same_tensors(dict(enumerate(weights_after)), dict(enumerate(weights_before)))
    assert_same_tensors(dict(enumerate(state_after)), dict(enumerate(state_before)))
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert len(summary.losses) == 6 and all(x == x for x in summary.losses)


def test_loss_spike_rolls_back_and_skips_the_data_window(small_corpus, tmp_path, monkeypatch):
    messages = []
    trainer = Trainer(cfg(small_corpus, tmp_path / "spike", "--recovery.spike_sigmas", "20", "--recovery.spike_window", "3"),
                      out=messages.append)
    real = trainer.model.forward_backward
    calls = []

    def poisoned(batches, n_targets):  # the 5th step's batch reports a loss 10x too high, once
        calls.append(1)
        return real(batches, n_targets) * (10.0 if len(calls) == 5 else 1.0)

    monkeypatch.setattr(trainer.model, "forward_backward", poisoned)
    summary = trainer.fit()
    assert any("loss spike at step 5: rolled back to step 4" in m for m in messages), messages
    assert summary.step == 6 and trainer.rollbacks == 1
    # the data of step 5 was skipped: after the rollback, step 5 trained on what step 6 would have read
    assert len(summary.losses) == 6
