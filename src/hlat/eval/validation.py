"""In-training validation settings: the loss on a fixed held-out set, every `every` steps.

The trainer builds the batches once (the same tokens every time, so the curve moves only because
the model does) and computes the loss with `ParallelModel.validation_loss`, on any layout.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EvalConfig:
    every: int = 0  # validation loss every N optimizer steps; 0 = never
    batches: int = 8  # held-out micro-batches per validation (fixed: the same tokens every time)

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        if self.every < 0:
            problems.append(("every", f"must be >= 0 (0 = no validation), got {self.every}"))
        if self.batches < 1:
            problems.append(("batches", f"must be >= 1, got {self.batches}; the validation set "
                             "is batches x train.micro_batch rows of data.seq_len tokens"))
        return problems

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0
