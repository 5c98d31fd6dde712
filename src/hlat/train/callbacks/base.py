"""The hooks a trainer calls, and callbacks named in the config by import path (train.callbacks).

Every hook runs on every rank, in the order of the trainer's callbacks (its own first, the user's
after them, then the metrics sinks, so that a user's `on_log` can add fields to a record before
it is written). Only global rank 0 writes logs. A hook that runs a collective must run it on
every rank alike.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hlat.errors import ConfigError

if TYPE_CHECKING:  # the trainer builds and calls callbacks; they only read it
    from hlat.checkpoint.manager import SaveStats
    from hlat.train.trainer import Trainer, TrainSummary


class Callback:
    """Override the hooks you need; each does nothing by default. `trainer.step` is the number of
    optimizer steps done so far."""

    def on_start(self, trainer: Trainer) -> None:
        """Before the first step of this invocation (after a resume: the step it resumed from)."""

    def on_step_start(self, trainer: Trainer) -> None:
        """Before step `trainer.step + 1` reads its data."""

    def on_window(self, trainer: Trainer, losses: list[float], skipped: int) -> None:
        """A logging step's one host sync: the global mean loss of each step since the previous
        logging step and the count of steps skipped so far. `trainer.roll_back(path)` here undoes
        the window: the step then ends without a record."""

    def on_log(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """A logging step's record (what metrics.jsonl holds) before it is written; fields added
        here are written with it."""

    def on_step_end(self, trainer: Trainer) -> None:
        """Step `trainer.step` and its logging are done (not called for a rolled-back step)."""

    def on_validation(self, trainer: Trainer, loss: float) -> None:
        """The validation loss at `trainer.step`."""

    def on_tasks(self, trainer: Trainer, scores: dict[str, float], seconds: float) -> None:
        """In-training task scores ({"<task>/<metric>": value} on rank 0, {} elsewhere)."""

    def on_checkpoint(self, trainer: Trainer, stats: SaveStats) -> None:
        """A checkpoint written, or launched in the background (stats.write_s is None) and later
        committed (stats.background)."""

    def on_rewind(self, trainer: Trainer, step: int) -> None:
        """The run went back to `step` (a rollback); what was recorded after it is undone."""

    def on_failure(self, trainer: Trainer, error: BaseException) -> None:
        """The run stops on `error` (raised again after the hooks)."""

    def on_end(self, trainer: Trainer, summary: TrainSummary) -> None:
        """The last step is done."""


def load_callback(path: str) -> Callback:
    """An instance of the Callback subclass "package.module:ClassName" names (train.callbacks)."""
    module_name, _, name = path.partition(":")
    if not module_name or not name.isidentifier():
        raise _problem(path, "is not an import path; write 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # a missing module, or one that fails while it imports
        raise _problem(
            path, f"does not import ({type(err).__name__}: {err}); put its package on PYTHONPATH or install it"
        ) from err
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Callback)):
        found = (
            "nothing" if cls is None else type(cls).__name__ if not isinstance(cls, type) else f"class {cls.__name__}"
        )
        raise _problem(path, f"names {found}, not a subclass of hlat.train.callbacks.base.Callback; name such a class")
    return cls()


def _problem(path: str, what: str) -> ConfigError:
    return ConfigError([("train.callbacks", f"{path!r} {what}")])
