"""The slow-rank report (hlat.parallel.slow_ranks) on each logging step: its fields in the record,
and a line for each rank that became slow or recovered, after the step's own line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hlat.parallel.hang import watch
from hlat.parallel.slow_ranks import SlowRankReport
from hlat.train.callbacks.base import Callback

if TYPE_CHECKING:
    from hlat.train.trainer import Trainer


class SlowRanks(Callback):
    def __init__(self, report: SlowRankReport):
        self.report = report
        self.lines: list[str] = []

    def on_log(self, trainer: Trainer, record: dict[str, Any]) -> None:
        with watch(trainer.layout, "compute-time all-gather of the slow-rank report", trainer.step):
            fields, self.lines = self.report.window(trainer.window.compute_s, trainer.window.steps)
        record.update(fields)

    def on_step_end(self, trainer: Trainer) -> None:
        for line in self.lines:
            trainer.out(line)
        self.lines = []
