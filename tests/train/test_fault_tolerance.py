"""Failures: a rank killed (SIGKILL) during training or while a checkpoint is being committed,
under torchrun --max-restarts; a NaN gradient; a loss spike. Injected with hlat.faults
(HLAT_FAULT) or by patching one step in-process.
"""

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hlat.checkpoint.manager import CheckpointManager
from hlat.config.load import load_config
from hlat.device import record
from hlat.optim import skips_exactly
from hlat.train.trainer import Trainer
from runs import Scenario, ScenarioResults, assert_same_tensors, checkpoint_tensors, tiny_args

STEPS = ["--train.steps", "6", "--checkpoint.every", "2"]
FAULTS = {"kill-rank1-training": "step:4:1", "kill-rank0-committing": "commit:4:0"}
# the uninterrupted run both kills are compared with, in the shared launch (tests/runs.py), and the
# kills: launches of their own (a kill and torchrun's restart), started from it (tests/launch_runs.py)
SCENARIOS = [Scenario("faults-straight", "train/layout_runs.py:train", 2, {"steps": 6, "extra": STEPS[2:]})] + [
    Scenario(
        f"faults-{name}",
        "launch_runs.py:hlat_train",
        kwargs={
            "nproc": 2,
            "extra": STEPS,
            "env": {"HLAT_FAULT": fault, "HLAT_FAULT_MARKER": "{out}/fault-done"},
            "restarts": 2,
        },
    )
    for name, fault in FAULTS.items()
]


@pytest.mark.parametrize("name", list(FAULTS))
def test_killed_rank_restarts_and_matches_uninterrupted_run(scenarios: ScenarioResults, tmp_path, name):
    straight = scenarios.path("faults-straight") / "run"
    killed = scenarios.path(f"faults-{name}")
    faulty = killed / "run"
    out = SimpleNamespace(**scenarios.json(f"faults-{name}", "result.json"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert (killed / "fault-done").is_file(), "the fault never fired"
    # step 4's checkpoint was never committed (or never started): the restart resumed from step 2
    assert "resuming from" in out.stdout and "step_00000002" in out.stdout, out.stdout[-2000:]
    assert "is deprecated" not in out.stderr, out.stderr[-2000:]  # no rank repeats a torch warning per checkpoint
    final = [CheckpointManager(run / "checkpoints", None).latest() for run in (straight, faulty)]
    assert final[0].name == final[1].name == "step_00000006"
    assert_same_tensors(checkpoint_tensors(final[1], tmp_path), checkpoint_tensors(final[0], tmp_path))


def cfg(corpus, run, *extra):
    return load_config("tiny", None, tiny_args(corpus, run, *STEPS, *extra))


def quiet(_: str) -> None:
    pass


def _optimizer_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    states = [state for opt in trainer.optimizers.optimizers for state in opt.state.values()]
    return {f"{i}.{key}": t.clone() for i, state in enumerate(states) for key, t in state.items()}


def _nan_at_step_3(trainer: Trainer, monkeypatch) -> list[tuple[list[torch.Tensor], dict[str, torch.Tensor]]]:
    """Give step 3 a NaN in one gradient entry; return the (weights, optimizer state) before and
    after it, filled as the run goes."""
    real = trainer.model.forward_backward
    snapshots = []

    def forced_nan(batches, n_targets):
        if len(snapshots) < 2 and trainer.step in (2, 3):  # the state before and after step 3
            snapshots.append(([p.detach().clone() for p in trainer.model.parameters()], _optimizer_state(trainer)))
        share = real(batches, n_targets)
        if trainer.step == 2:  # running step 3
            next(p for p in trainer.model.parameters() if p.grad is not None).grad.view(-1)[0] = float("nan")
        return share

    monkeypatch.setattr(trainer.model, "forward_backward", forced_nan)
    return snapshots


def _skipped_steps(run) -> list[int]:
    return [json.loads(line)["skipped_steps"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["fp32", "bf16-sr"])
def test_nonfinite_gradient_step_is_skipped_exactly(small_corpus, tmp_path, monkeypatch, mode):
    """Step 3 gets a NaN gradient: weights, moments and step counts after it equal those before it."""
    run = tmp_path / mode
    trainer = Trainer(
        cfg(small_corpus, run, "--precision.mode", mode, "--precision.compile_optimizer", "false"), out=quiet
    )
    snapshots = _nan_at_step_3(trainer, monkeypatch)
    summary = trainer.fit()
    assert _skipped_steps(run) == [0, 0, 1, 1, 1, 1]
    (weights_before, state_before), (weights_after, state_after) = snapshots
    assert_same_tensors(dict(enumerate(weights_after)), dict(enumerate(weights_before)))
    assert_same_tensors(state_after, state_before)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert len(summary.losses) == 6 and all(x == x for x in summary.losses)


def test_nonfinite_gradient_step_on_foreach_adamw_steps_on_zeroed_gradients(small_corpus, tmp_path, monkeypatch):
    """A device without fused AdamW (the CPU's record patched to say so): the skipped step is an
    AdamW step on all-zero gradients, so the moments decay by beta1 and beta2 and nothing turns NaN."""
    monkeypatch.setitem(record.RECORDS, "cpu", dataclasses.replace(record.RECORDS["cpu"], fused_adamw=False))
    run = tmp_path / "foreach"
    trainer = Trainer(cfg(small_corpus, run, "--train.steps", "4"), out=quiet)
    assert not any(skips_exactly(opt) for opt in trainer.optimizers.optimizers)  # the fallback is what runs
    snapshots = _nan_at_step_3(trainer, monkeypatch)
    summary = trainer.fit()
    assert _skipped_steps(run) == [0, 0, 1, 1]
    (_, before), (_, after) = snapshots
    optim = trainer.cfg.optim
    for key, value in before.items():
        kind = key.split(".")[-1]
        if kind == "step":
            assert after[key] == value + 1, key
        else:  # exp_avg lerps towards the zero gradient; exp_avg_sq is multiplied by beta2
            beta = optim.beta1 if kind == "exp_avg" else optim.beta2
            torch.testing.assert_close(after[key], beta * value, rtol=1e-6, atol=0, msg=key)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert len(summary.losses) == 4 and all(x == x for x in summary.losses)


def _batch_ids(batches) -> list[tuple[int, ...]]:
    return [tuple(b.tokens.flatten().tolist()) for b in batches]


def test_loss_spike_rolls_back_and_skips_the_data_window(small_corpus, tmp_path, monkeypatch):
    """Checkpoints every 4 steps, logs every 2; step 7 reports a spike, found at the log of step 8:
    the run goes back to step 4, skips the data of steps 5-8 and trains steps 5-8 again on the
    data an uninterrupted run would have read at steps 9-12. metrics.jsonl and TensorBoard then
    hold each step once, with the values of the steps that were kept."""
    args = [
        "--train.steps", "8", "--checkpoint.every", "4", "--train.log_every", "2", "--train.tensorboard", "true",
        "--recovery.spike_sigmas", "20", "--recovery.spike_window", "3",
    ]  # fmt: skip
    run = tmp_path / "spike"
    messages = []
    reference = Trainer(cfg(small_corpus, tmp_path / "reference", *args), out=quiet)  # only reads its data
    expected = [
        _batch_ids(reference.loader.next_batch() for _ in range(reference.accum)) for _ in range(12)
    ]  # steps 1-12
    trainer = Trainer(cfg(small_corpus, run, *args), out=messages.append)
    real = trainer.model.forward_backward
    trained = []

    def poisoned(batches, n_targets):  # step 7 reports a loss 10x too high, once; its gradient is untouched
        trained.append(_batch_ids(batches))
        return real(batches, n_targets) * (10.0 if len(trained) == 7 else 1.0)

    monkeypatch.setattr(trainer.model, "forward_backward", poisoned)
    summary = trainer.fit()
    assert any(
        m.startswith("loss spike at step 7 (loss ")
        and "rolled back to step 4 (step_00000004) and skipped the 4 steps" in m
        for m in messages
    ), messages
    assert summary.step == 8 and trainer.recovery.rollbacks == 1
    # Trained on, in order: steps 1-8 (5-8 then undone), then 9-12: no batch skipped but the
    # window 5-8, none trained twice.
    assert trained == expected
    assert len(summary.losses) == 8  # this invocation's steps 1-4 and the redone 5-8
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [2, 4, 6, 8]  # step 6 of the rolled-back window once
    logged = {r["step"]: r["loss"] for r in records if "loss" in r}
    for step in (2, 4, 6, 8):
        window = summary.losses[step - 2 : step]
        assert logged[step] == sum(window) / 2
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
        (k, pytest.approx(v)) for k, v in logged.items()
    ]
