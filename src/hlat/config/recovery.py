"""`[recovery]`: what a run does about non-finite gradients and loss spikes (hlat.train.recovery)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hlat.config.fields import choice_problems

Action = Literal["skip", "rollback", "error"]
WrongComputationAction = Literal["stop", "exclude"]


@dataclass
class RecoveryConfig:
    """`[recovery]`: what a run does about non-finite gradients and loss spikes."""

    nonfinite: Action = "skip"
    """A step whose gradient is NaN/Inf: "skip" leaves weights and optimizer state as they were
    (counted, logged as skipped_steps); "rollback" also rolls back to the last checkpoint and skips
    the data read since; "error" stops the run, as HLAT did."""
    max_grad_norm: float = 0.0
    """> 0: steps whose pre-clip global grad norm exceeds it are skipped too."""
    spike_sigmas: float = 0.0
    """> 0: loss spike detection on, at this many standard deviations above the mean (e.g. 6)."""
    spike_window: int = 50
    """Good steps the mean and standard deviation are taken over."""
    spike_action: Action = "rollback"
    """On a loss spike: "rollback" restores the last checkpoint and skips the data read since it, up
    to the logging step that found the spike (the PaLM/OLMo remedy); "skip" only reports it;
    "error" stops the run."""
    max_rollbacks: int = 3
    """A run that keeps diverging stops after this many rollbacks instead of looping."""
    wrong_computation: WrongComputationAction = "stop"
    """When train.replay_every names a node computing wrong: "stop" ends the run (every elastic
    group too) with exit status 3; "exclude" (elastic runs) ends only the group holding that node,
    with exit status 3, and the others retry the step without it and go on."""

    def validate(self) -> list[tuple[str, str]]:
        problems = choice_problems(self, "nonfinite", "spike_action", "wrong_computation")
        if self.max_grad_norm < 0 or self.spike_sigmas < 0:
            problems.append(("spike_sigmas" if self.spike_sigmas < 0 else "max_grad_norm", "must be >= 0 (0 = off)"))
        if self.spike_window < 2:
            problems.append(("spike_window", f"must be >= 2 to have a standard deviation, got {self.spike_window}"))
        if self.max_rollbacks < 0:
            problems.append(("max_rollbacks", f"must be >= 0, got {self.max_rollbacks}"))
        return problems
