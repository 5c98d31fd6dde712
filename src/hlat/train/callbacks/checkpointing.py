"""Checkpoints every checkpoint.every steps and at the last, and weight archives every
checkpoint.archive_every_tokens tokens (hlat.train.resume says what they hold)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlat.checkpoint.manager import SaveStats
from hlat.parallel.hang import watch
from hlat.train.callbacks.base import Callback

if TYPE_CHECKING:
    from hlat.train.trainer import Trainer, TrainSummary


class Checkpointing(Callback):
    """A save (collective) on the steps `trainer.checkpoint_due()` names; under checkpoint.async_save
    the previous one is committed first, and the last one when the run ends or stops on an interrupt."""

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.checkpoint_due():
            with watch(trainer.layout, "checkpoint save", trainer.step):
                self._report(trainer, trainer.checkpoints.wait())  # the previous background save, committed by now
                self._report(trainer, trainer.save())
                if trainer.stopping:
                    self._report(trainer, trainer.checkpoints.wait())

    def on_end(self, trainer: Trainer, summary: TrainSummary) -> None:
        self._report(trainer, trainer.checkpoints.wait())

    def _report(self, trainer: Trainer, stats: SaveStats | None) -> None:
        """A background save is reported once at launch and once when committed."""
        if stats is None:
            return
        if stats.write_s is None:
            trainer.out(
                f"checkpoint: writing {stats.path.name} in the background (training blocked {stats.blocking_s:.2f} s)"
            )
        elif stats.background:
            trainer.out(
                f"checkpoint: {stats.path} committed (written in {stats.write_s:.2f} s, training blocked "
                f"{stats.blocking_s:.2f} s)"
            )
        else:
            trainer.out(f"checkpoint: {stats.path} ({stats.write_s:.2f} s)")
        trainer.emit("on_checkpoint", stats)


class WeightArchives(Callback):
    """A weights-only checkpoint under archive/ (never pruned) each time the tokens seen cross a
    multiple of `every`."""

    def __init__(self, every: int):
        self.every = every

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.tokens // self.every > (trainer.tokens - trainer.tokens_per_step) // self.every:
            stats = trainer.state.archive_weights(trainer.progress())
            trainer.out(f"archived weights: {stats.path} ({stats.blocking_s:.2f} s)")
