"""The one interface every metrics destination implements (console, metrics.jsonl, TensorBoard,
Weights & Biases): MetricSinks fans each record out to them in turn.

A record is a dict with a "step": a training record per logging step, a validation record
("val_loss"), or a tasks record ("eval/<task>/<metric>" values and "eval_seconds").
"""

from __future__ import annotations

from typing import Any


class Sink:
    """Every method does nothing unless a sink overrides it."""

    target = "a metrics sink"  # what it writes to, for a message about it (a full disk)

    def rewind(self, step: int) -> None:
        """The run continues from `step` (at start-up, on resume and on each rollback): whatever
        was recorded after it is to be forgotten or hidden."""

    def advance(self) -> None:
        """One optimizer step done."""

    def log(self, record: dict[str, Any]) -> None:
        """A logging step's training record."""

    def log_validation(self, record: dict[str, Any]) -> None:
        """{"step", "tokens", "val_loss", "val_ppl"}."""

    def log_tasks(self, record: dict[str, Any]) -> None:
        """{"step", "tokens", "eval/<task>/<metric>": value, ..., "eval_seconds"}."""

    def close(self) -> None:
        pass
