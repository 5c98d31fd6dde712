"""Acting on non-finite steps and loss spikes as the recovery config says (judged by
hlat.train.recovery): raise, warn, or roll back to the last checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlat.config.recovery import RecoveryConfig
from hlat.train.callbacks.base import Callback
from hlat.train.recovery import Recovery

if TYPE_CHECKING:
    from hlat.train.trainer import Trainer


class SpikeRecovery(Callback):
    """`skipped_steps`: the skipped-step counter where the run starts."""

    def __init__(self, cfg: RecoveryConfig, skipped_steps: int):
        self.cfg = cfg
        self.recovery = Recovery(cfg, skipped_steps)

    @property
    def rollbacks(self) -> int:
        return self.recovery.rollbacks

    def on_window(self, trainer: Trainer, losses: list[float], skipped: int) -> None:
        incident = self.recovery.judge(losses, skipped, trainer.step)
        if incident is None:
            return
        if incident.action == "rollback":
            path = trainer.state.latest_resumable()
            if path is not None and self.recovery.may_roll_back():
                undone = trainer.roll_back(path)
                self.recovery.rolled_back(trainer.module.skipped_steps)
                trainer.out(
                    f"{incident.what}: rolled back to step {trainer.step} ({path.name}) and skipped the {undone} steps "
                    f"of data read since (rollback {self.recovery.rollbacks} of at most {self.cfg.max_rollbacks})"
                )
                return
        reason = (
            "recovery.spike_action=skip"
            if incident.action == "skip"
            else f"no checkpoint to roll back to, or recovery.max_rollbacks={self.cfg.max_rollbacks} reached"
        )
        trainer.out(f"warning: {incident.what}; continuing ({reason})")
