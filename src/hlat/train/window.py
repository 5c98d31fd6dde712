"""The steps since the last logging step, whose times the logging step reports."""

from __future__ import annotations

import time
from dataclasses import dataclass

from hlat.metrics.memory import MemoryMeter


@dataclass
class Window:
    started: float  # perf_counter at the window's start, less time spent evaluating
    memory: MemoryMeter  # peak memory since the last logging step
    steps: int = 0
    data_s: float = 0.0  # time the steps waited for the loader and the copy to the device
    compute_s: float = 0.0  # the training thread's CPU time inside the steps (hlat.parallel.slow_ranks)

    def exclude(self, seconds: float) -> None:
        """Keep `seconds` (spent evaluating, not training) out of the window's tokens/s."""
        self.started += seconds

    def restart(self) -> None:
        self.started, self.steps, self.data_s, self.compute_s = time.perf_counter(), 0, 0.0, 0.0
