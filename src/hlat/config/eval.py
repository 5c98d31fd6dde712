"""`[eval]`: in-training evaluation (hlat.eval.in_training runs it).

Validation loss: the loss on a fixed held-out set every `every` steps. The trainer builds the
batches once (the same tokens every time, so the curve moves only because the model does) and
computes the loss with `ParallelModel.validation_loss`, on any layout.

Downstream tasks: the first `tasks_limit` documents of each task in `tasks`, every `tasks_every`
steps and at the last step, scored on rank 0 by hlat.eval.in_training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class EvalConfig:
    """`[eval]`: validation loss and downstream tasks during training."""

    every: int = 0
    """Validation loss every N optimizer steps; 0 = never."""
    batches: int = 8
    """Held-out micro-batches per validation (fixed: the same tokens every time)."""
    tasks: str = ""
    """Comma-separated task names (hlat eval --list); empty = no downstream tasks."""
    tasks_every: int = 0
    """Downstream tasks every N optimizer steps (and at the last); 0 = never."""
    tasks_limit: int = 100
    """Documents per task: the first N of its evaluation split."""
    tasks_shots: int = -1
    """Few-shot examples per prompt; -1 = each task's default (the paper's)."""
    data_dir: str = ""
    """Local task files (<dir>/<task>/<split>.jsonl); empty = the hub."""

    def task_names(self) -> list[str]:
        return [name.strip() for name in self.tasks.split(",") if name.strip()]

    def validate(self) -> list[tuple[str, str]]:
        """The values' problems; which task names exist is hlat.eval.tasks.task_name_problems'."""
        problems = []
        if self.every < 0:
            problems.append(("every", f"must be >= 0 (0 = no validation), got {self.every}"))
        if self.batches < 1:
            problems.append(
                (
                    "batches",
                    f"must be >= 1, got {self.batches}; the validation set "
                    "is batches x train.micro_batch rows of data.seq_len tokens",
                )
            )
        if self.tasks_every < 0:
            problems.append(("tasks_every", f"must be >= 0 (0 = no downstream tasks), got {self.tasks_every}"))
        elif self.tasks_every and not self.task_names():
            problems.append(
                (
                    "tasks_every",
                    f"is {self.tasks_every} but eval.tasks is empty; name the tasks "
                    "(--eval.tasks arc_easy,piqa) or set eval.tasks_every 0",
                )
            )
        elif self.task_names() and not self.tasks_every:
            problems.append(
                (
                    "tasks",
                    f"{self.tasks!r} would never run because eval.tasks_every is 0; set "
                    "--eval.tasks_every N (steps), or clear eval.tasks",
                )
            )
        if self.tasks_limit < 1:
            problems.append(("tasks_limit", f"must be >= 1 document per task, got {self.tasks_limit}"))
        if self.tasks_shots < -1:
            problems.append(("tasks_shots", f"must be >= 0, or -1 for each task's default, got {self.tasks_shots}"))
        if self.data_dir and not Path(self.data_dir).expanduser().is_dir():
            problems.append(
                (
                    "data_dir",
                    f"{self.data_dir} is not a directory; point it at the local task "
                    "files (<dir>/<task>/<split>.jsonl, see docs/evaluation.md) or leave it empty for the hub",
                )
            )
        return problems

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def tasks_due(self, step: int, last_step: int) -> bool:
        return self.tasks_every > 0 and (step % self.tasks_every == 0 or step == last_step)
