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
from typing import Literal

from hlat.config.recovery import RecoveryConfig


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


@dataclass
class Incident:
    """What a logging window went wrong with, and what the config says to do about it."""

    step: int  # the first bad step
    what: str  # e.g. "loss spike at step 5 (loss 9.1234)", for messages
    action: Literal["rollback", "skip"]


class Recovery:
    """Judges each logging window by the recovery config: raises where it says "error", otherwise
    returns what to do; counts the rollbacks made."""

    def __init__(self, cfg: RecoveryConfig, skipped_steps: int):
        self.cfg = cfg
        self.spikes = SpikeDetector(cfg.spike_sigmas, cfg.spike_window)
        self.skipped_judged = skipped_steps  # the skipped-step counter as last judged
        self.rollbacks = 0

    def judge(self, losses: list[float], skipped_steps: int, last_step: int) -> Incident | None:
        """`losses` of the consecutive steps ending at `last_step`; `skipped_steps` the counter now."""
        cfg = self.cfg
        first_step = last_step - len(losses) + 1
        new_skips = skipped_steps - self.skipped_judged
        self.skipped_judged = skipped_steps
        spike = self.spikes.first_spike(losses)
        if new_skips and cfg.nonfinite == "error":
            raise FloatingPointError(
                f"{new_skips} step(s) with NaN/Inf gradients in steps {first_step}-{last_step} "
                "(recovery.nonfinite=error); lower --optim.lr or check the data"
            )
        if spike is not None:
            bad = first_step + spike
            what = f"loss spike at step {bad} (loss {losses[spike]:.4f})"
            if cfg.spike_action == "error":
                raise FloatingPointError(f"{what} (recovery.spike_action=error); lower --optim.lr or check the data")
            return Incident(bad, what, "skip" if cfg.spike_action == "skip" else "rollback")
        if new_skips and cfg.nonfinite == "rollback":
            return Incident(first_step, f"{new_skips} non-finite step(s) in steps {first_step}-{last_step}", "rollback")
        return None

    def may_roll_back(self) -> bool:
        return self.rollbacks < self.cfg.max_rollbacks

    def rolled_back(self, skipped_steps: int) -> None:
        """The run went back to a checkpoint whose skipped-step counter is `skipped_steps`."""
        self.rollbacks += 1
        self.skipped_judged = skipped_steps
