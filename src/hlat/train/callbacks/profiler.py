"""--profile.steps A:B as a callback: hlat.metrics.profiling.StepProfiler around those steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlat.metrics.profiling import StepProfiler
from hlat.train.callbacks.base import Callback

if TYPE_CHECKING:
    from hlat.train.trainer import Trainer, TrainSummary


class Profiler(Callback):
    def __init__(self, profiler: StepProfiler):
        self.profiler = profiler

    def on_step_start(self, trainer: Trainer) -> None:
        self.profiler.before_step(trainer.step + 1)

    def on_failure(self, trainer: Trainer, error: BaseException) -> None:
        self.profiler.stop()

    def on_end(self, trainer: Trainer, summary: TrainSummary) -> None:
        self.profiler.stop()
