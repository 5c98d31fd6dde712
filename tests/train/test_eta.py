"""The ETA a run reports (metrics.jsonl's eta_s and the console line's `eta`) is the steps left to
train.steps at this launch's mean step time (docs/training.md), pinned with a scripted clock: a
resumed run whose first launch was ten times slower must not inherit that rate."""

from __future__ import annotations

import time
from types import SimpleNamespace

import hlat.train.trainer as trainer_module
import hlat.train.window as window_module
from hlat.config.load import load_config
from hlat.metrics.sinks import read_metrics
from hlat.train.callbacks.base import Callback
from hlat.train.trainer import Trainer
from runs import tiny_args


class ScriptedClock(Callback):
    """The trainer's perf_counter, moved only when a step starts, by `step_s`: each step takes
    exactly that long, whatever the machine does."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 1000.0, step_s

    def perf_counter(self) -> float:
        return self.now

    def on_step_start(self, trainer: Trainer) -> None:
        self.now += self.step_s


def _train(monkeypatch, small_corpus, run_dir, step_s: float, steps: int, *extra: str) -> None:
    clock = ScriptedClock(step_s)
    fake = SimpleNamespace(perf_counter=clock.perf_counter, thread_time=time.thread_time, time=time.time)
    for module in (trainer_module, window_module):
        monkeypatch.setattr(module, "time", fake)
    args = tiny_args(small_corpus, run_dir, "--train.steps", str(steps), "--train.log_every", "2", *extra)
    Trainer(load_config("tiny", None, args), out=lambda _: None, callbacks=[clock]).fit()


def test_eta_is_the_steps_left_at_this_launchs_rate(small_corpus, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    # the first launch: 4 steps of 300 s
    _train(monkeypatch, small_corpus, run, 300.0, 4, "--checkpoint.every", "4")
    assert [(r["step"], r["eta_s"]) for r in read_metrics(run) if "eta_s" in r] == [(2, 600.0), (4, 0.0)]
    capsys.readouterr()
    # the resume to step 10: 30 s a step; a rate from step 0 (this launch's time over all 6 steps,
    # or the whole run's 1,320 s) would be off
    _train(monkeypatch, small_corpus, run, 30.0, 10, "--checkpoint.every", "10")
    resumed = [(r["step"], r["eta_s"]) for r in read_metrics(run) if "eta_s" in r][2:]
    assert resumed == [(6, 120.0), (8, 60.0), (10, 0.0)]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.rsplit("| eta ", 1)[1].split(" |")[0] for line in lines] == ["2:00", "1:00", "0:00"]
