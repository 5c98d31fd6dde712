"""Interrupts (hlat.train.interrupt): SIGINT or SIGTERM during training saves the step it ends, says
where a resume starts, and the resume continues exactly (the final weights equal an uninterrupted
run's); under torchrun a signal that reaches one rank stops every rank after the same step. A
second signal, or a save that cannot finish in time, stops at once and names the checkpoint a
resume uses. Other commands only say they were interrupted. Signals come from hlat.faults
(HLAT_FAULT=sigint|sigterm:STEP:RANK[:COUNT], sent before optimizer step STEP)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hlat.checkpoint.manager import CheckpointManager
from hlat.cli import main
from hlat.metrics.sinks import read_metrics
from hlat.train import interrupt
from runs import Scenario, ScenarioResults, assert_same_tensors, checkpoint_tensors, tiny_args

STEPS = ["--train.steps", "6", "--checkpoint.every", "2"]
SCENARIOS = [
    Scenario("faults-straight", "train/layout_runs.py:train", 2, {"steps": 6, "extra": STEPS[2:]}),
    Scenario("interrupt-rank1", "train/layout_runs.py:interrupted", 2, {"steps": 6, "fault": "sigterm:3:1", "extra": STEPS[2:]}),
]  # fmt: skip
SAVED_3 = "interrupted ({}): saved step 3; run the same command to resume from step 3"


def test_a_signal_to_one_rank_stops_both_after_the_same_step(scenarios: ScenarioResults, tmp_path):
    out = scenarios.path("interrupt-rank1")
    # rank 1 alone was signalled before step 3: both ranks saved step 3 and stopped
    assert [(out / f"interrupted.rank{r}.txt").read_text() for r in (0, 1)] == [SAVED_3.format("SIGTERM")] * 2
    resumed = scenarios.json("interrupt-rank1", "summary.rank0.json")
    assert any("resuming from" in m and "step_00000003" in m for m in resumed["messages"]), resumed["messages"]
    final = [
        CheckpointManager(d / "run" / "checkpoints", None).latest() for d in (scenarios.path("faults-straight"), out)
    ]
    assert final[0].name == final[1].name == "step_00000006"
    assert_same_tensors(checkpoint_tensors(final[1], tmp_path), checkpoint_tensors(final[0], tmp_path))


def _train(corpus: Path, run: Path, capsys, monkeypatch, fault: str = "", *extra: str) -> tuple[int, str]:
    if fault:
        monkeypatch.setenv("HLAT_FAULT", fault)
        monkeypatch.setenv("HLAT_FAULT_MARKER", str(run.parent / f"{run.name}-fault-done"))
    else:
        monkeypatch.delenv("HLAT_FAULT", raising=False)
    capsys.readouterr()
    code = main(["train", *tiny_args(corpus, run, *STEPS, *extra)])
    return code, capsys.readouterr().err


def test_sighup_saves_the_step_as_sigterm_does(small_corpus, tmp_path):
    """A closed terminal or ssh session: the step is saved and the run says where it resumes. In a
    process of its own: unhandled, the signal would end the test session."""
    run = tmp_path / "run"
    env = {**os.environ, "HLAT_TESTING": "1", "HLAT_FAULT": "sighup:3:0", "HLAT_FAULT_MARKER": str(tmp_path / "m")}
    done = subprocess.run(
        [sys.executable, "-m", "hlat", "train", *tiny_args(small_corpus, run, *STEPS)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 128 + signal.SIGHUP, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == "hlat train: " + SAVED_3.format("SIGHUP")


def test_sigint_saves_the_step_and_the_resume_is_exact(small_corpus, tmp_path, capsys, monkeypatch):
    """Two signals back to back (a terminal's Ctrl-C reaches torchrun's workers directly and again
    through torchrun) are one interrupt."""
    assert _train(small_corpus, tmp_path / "straight", capsys, monkeypatch)[0] == 0
    code, err = _train(small_corpus, tmp_path / "run", capsys, monkeypatch, "sigint:3:0:2")
    assert (code, err.splitlines()[-1]) == (130, "hlat train: " + SAVED_3.format("SIGINT"))
    assert _train(small_corpus, tmp_path / "run", capsys, monkeypatch)[0] == 0
    losses = [[(r["step"], r["loss"]) for r in read_metrics(tmp_path / d) if "loss" in r] for d in ("straight", "run")]
    assert losses[1] == losses[0] and len(losses[0]) == 6  # no step lost or repeated
    final = [CheckpointManager(tmp_path / d / "checkpoints", None).latest() for d in ("straight", "run")]
    assert_same_tensors(checkpoint_tensors(final[1], tmp_path), checkpoint_tensors(final[0], tmp_path))


@pytest.mark.parametrize(
    "fault,extra,message",
    [
        ("sigint:3:0:2", [], "(SIGINT: a second signal) in step 3, nothing saved; run the same command to resume from step 2 ({run}/checkpoints/step_00000002)"),
        ("sigint:1:0:2", [], "(SIGINT: a second signal) in step 1, nothing saved; no checkpoint exists: the same command starts over"),
        ("sigterm:3:0", ["--train.interrupt_save_s", "0"], "(SIGTERM: train.interrupt_save_s = 0) in step 3, nothing saved; run the same command to resume from step 2"),
        ("sigterm:3:0", ["--train.interrupt_save_s", "0.001"], "(SIGTERM: the step did not end and save within train.interrupt_save_s=0.001 s)"),
    ],
    ids=["second-signal", "second-signal-no-checkpoint", "no-grace", "deadline"],
)  # fmt: skip
def test_a_stop_without_saving_names_the_checkpoint_a_resume_uses(
    small_corpus, tmp_path, capsys, monkeypatch, fault, extra, message
):
    monkeypatch.setattr(interrupt, "SAME_SIGNAL_S", 0.0)  # the two signals are two interrupts
    code, err = _train(small_corpus, tmp_path / "run", capsys, monkeypatch, fault, *extra)
    assert code == 128 + (2 if "sigint" in fault else 15)
    assert err.splitlines()[-1].startswith("hlat train: interrupted " + message.format(run=tmp_path / "run")), err


def test_other_commands_say_nothing_about_checkpoints(tmp_path, capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("hlat.commands.eval._evaluate", interrupted)
    assert main(["eval", "--checkpoint", str(tmp_path), "--tasks", "arc_easy"]) == 130
    assert capsys.readouterr().err == "hlat eval: interrupted\n"
