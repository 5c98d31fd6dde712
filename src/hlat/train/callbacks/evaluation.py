"""Validation loss on the fixed held-out batches (eval.every, and at the last step) and in-training
downstream tasks (eval.tasks_every), both collective."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlat.data.batch import Batch
from hlat.eval.in_training import InTrainingTasks
from hlat.parallel.hang import watch
from hlat.train.callbacks.base import Callback

if TYPE_CHECKING:
    from hlat.train.trainer import Trainer


class ValidationLoss(Callback):
    """`batches`: this data-parallel rank's held-out micro-batches, on the device (built once: every
    evaluation sees the same tokens)."""

    def __init__(self, batches: list[Batch]):
        self.batches = batches

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.cfg.eval.due(trainer.step) or trainer.step == trainer.cfg.train.steps:
            with watch(trainer.layout, "validation loss", trainer.step):
                loss = trainer.module.validation_loss(self.batches)
            trainer.emit("on_validation", loss)


class Tasks(Callback):
    def __init__(self, tasks: InTrainingTasks):
        self.tasks = tasks

    def on_step_end(self, trainer: Trainer) -> None:
        if self.tasks.due(trainer.step, trainer.cfg.train.steps):
            with watch(trainer.layout, "downstream tasks (gathering the weights to rank 0)", trainer.step):
                scores, seconds = self.tasks.run(trainer.model.parts)  # collective; rank 0 scores
            trainer.window.exclude(seconds)  # evaluation is not training: keep it out of tokens/s
            trainer.emit("on_tasks", scores, seconds)
