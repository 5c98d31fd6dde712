"""What a run does about numerical failures: non-finite gradients and loss spikes.

Non-finite (or over `max_grad_norm`) steps are caught on device, every step, without a host
sync (hlat.train.step): the optimizers skip them exactly and they are counted. Loss spikes are judged
on the host at logging steps, where the losses are read anyway: a step's loss above the mean of
the previous `spike_window` good steps by more than `spike_sigmas` standard deviations.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

ACTIONS = ("skip", "rollback", "error")


@dataclass
class RecoveryConfig:
    # A step whose gradient is NaN/Inf: "skip" leaves weights and optimizer state as they were
    # (counted, logged as skipped_steps); "rollback" also rolls back to the last checkpoint and skips the data read
    # since; "error" stops the run, as HLAT did.
    nonfinite: str = "skip"
    max_grad_norm: float = 0.0  # > 0: steps whose pre-clip global grad norm exceeds it are skipped too
    spike_sigmas: float = 0.0  # > 0: loss spike detection on (e.g. 6)
    spike_window: int = 50  # good steps the mean and standard deviation are taken over
    # On a loss spike: "rollback" restores the last checkpoint and skips the data window from it
    # to the spike (the PaLM/OLMo remedy); "skip" only reports it; "error" stops the run.
    spike_action: str = "rollback"
    max_rollbacks: int = 3  # a run that keeps diverging stops instead of looping

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        for name in ("nonfinite", "spike_action"):
            if getattr(self, name) not in ACTIONS:
                problems.append((name, f"got {getattr(self, name)!r}; choose one of {', '.join(ACTIONS)}"))
        if self.max_grad_norm < 0 or self.spike_sigmas < 0:
            problems.append(("spike_sigmas" if self.spike_sigmas < 0 else "max_grad_norm", "must be >= 0 (0 = off)"))
        if self.spike_window < 2:
            problems.append(("spike_window", f"must be >= 2 to have a standard deviation, got {self.spike_window}"))
        if self.max_rollbacks < 0:
            problems.append(("max_rollbacks", f"must be >= 0, got {self.max_rollbacks}"))
        return problems


class SpikeDetector:
    """Rolling mean and standard deviation of the good losses; spikes are not added to them."""

    def __init__(self, sigmas: float, window: int):
        self.sigmas = sigmas
        self.history: deque[float] = deque(maxlen=window)

    def first_spike(self, losses: list[float]) -> int | None:
        """Index in `losses` (consecutive steps) of the first spike, or None; records the rest."""
        for i, loss in enumerate(losses):
            if not math.isfinite(loss):  # a skipped step: recovery.nonfinite decides, not this
                continue
            if self.is_spike(loss):
                return i
            self.history.append(loss)
        return None

    def is_spike(self, loss: float) -> bool:
        if self.sigmas <= 0 or len(self.history) < self.history.maxlen:
            return False
        mean = sum(self.history) / len(self.history)
        std = math.sqrt(sum((x - mean) ** 2 for x in self.history) / (len(self.history) - 1))
        return loss > mean + self.sigmas * max(std, 1e-6)
