"""A line between logging steps when they are far apart, as the start-up phases print one
(hlat.progress.Heartbeat): a slow step, a loaded machine or a large log_every is never silent."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hlat.progress import duration, heartbeat_s
from hlat.train.callbacks.base import Callback

if TYPE_CHECKING:
    from hlat.train.trainer import Trainer, TrainSummary


class StepHeartbeat(Callback):
    """After `interval_s` (default HLAT_HEARTBEAT_S, 30 s) without a logged step, and every
    `interval_s` after that, "heartbeat: on step N/T, M:SS since the last log line", from a daemon
    thread (so a step that blocks in C code is still reported)."""

    def __init__(self, out: Callable[[str], None], interval_s: float | None = None) -> None:
        self.out = out
        self.interval_s = heartbeat_s() if interval_s is None else interval_s
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._logged = self._beat = 0.0  # perf_counter of the last log line, and of the last line

    def on_start(self, trainer: Trainer) -> None:
        self._logged = self._beat = time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(trainer,), name="hlat-step-heartbeat", daemon=True)
        self._thread.start()

    def on_log(self, trainer: Trainer, record: dict[str, Any]) -> None:
        self._logged = self._beat = time.perf_counter()

    def _run(self, trainer: Trainer) -> None:
        while not self._done.wait(max(self._beat + self.interval_s - time.perf_counter(), 0.0)):
            now = time.perf_counter()
            if now - self._beat < self.interval_s:  # a step was logged meanwhile
                continue
            self._beat, total = now, trainer.cfg.train.steps
            self.out(
                f"heartbeat: on step {min(trainer.step + 1, total):,}/{total:,}, "
                f"{duration(now - self._logged)} since the last log line"
            )

    def _stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def on_failure(self, trainer: Trainer, error: BaseException) -> None:
        self._stop()

    def on_end(self, trainer: Trainer, summary: TrainSummary) -> None:
        self._stop()
