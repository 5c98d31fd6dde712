"""Between logging steps the loop is never silent for long (a heartbeat line), and before step 1 a
run says how long the planner expects it to take."""

from __future__ import annotations

import time

from hlat.config.load import load_config
from hlat.train.callbacks.base import Callback
from hlat.train.trainer import Trainer
from runs import tiny_args


class SlowSecondStep(Callback):
    """Step 2 lasts until a heartbeat has reported it (60 s at most): slow, whatever the machine."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def on_step_start(self, trainer: Trainer) -> None:
        deadline = time.monotonic() + 60
        while trainer.step == 1 and not self._reported() and time.monotonic() < deadline:
            time.sleep(0.01)

    def _reported(self) -> bool:
        return any(line.startswith("heartbeat: on step 2/3,") for line in self.lines)


def test_a_slow_step_between_log_steps_prints_a_heartbeat_after_the_estimate(small_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("HLAT_HEARTBEAT_S", "0.05")  # the interval the product reads (30 s by default)
    lines: list[str] = []
    args = tiny_args(small_corpus, tmp_path / "run", "--train.steps", "3", "--train.log_every", "3")
    Trainer(load_config("tiny", None, args), out=lines.append, callbacks=[SlowSecondStep(lines)]).fit()
    beats = [i for i, line in enumerate(lines) if line.startswith("heartbeat: on step 2/3, 0:0")]
    assert beats and lines[beats[0]].endswith(" since the last log line")
    (estimate,) = [i for i, line in enumerate(lines) if line.startswith("estimate (hlat plan's model at ")]
    assert "not a measurement): " in lines[estimate] and lines[estimate].endswith(" for 3 steps")
    training = next(i for i, line in enumerate(lines) if line.startswith("training 3 steps"))
    assert estimate < training < beats[0]
