"""The run's records to its sinks (console, metrics.jsonl, TensorBoard, W&B) on global rank 0,
the loss plot, and the line that ends a run."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from hlat.metrics.sinks import MetricSinks, plot_loss
from hlat.metrics.wandb_sink import WandbSink
from hlat.model import count_params
from hlat.train.callbacks.base import Callback

if TYPE_CHECKING:
    from hlat.train.trainer import Trainer, TrainSummary


class Metrics(Callback):
    """Opens the sinks where the run starts (dropping what was recorded after that step)."""

    def __init__(self) -> None:
        self.sinks: MetricSinks | None = None

    def on_start(self, trainer: Trainer) -> None:
        cfg = trainer.cfg
        wandb = None
        if cfg.wandb.enabled:
            config = {"name": cfg.name, **{name: asdict(section) for name, section in cfg.sections().items()}}
            wandb = WandbSink(cfg.wandb, cfg.name, trainer.run_dir, config)
        self.sinks = MetricSinks(
            trainer.run_dir,
            cfg.train.steps,
            trainer.step,
            cfg.train.tensorboard,
            wandb,
            full=lambda why: trainer.request_stop(f"disk full writing {why}; free space there"),
        )

    def on_log(self, trainer: Trainer, record: dict[str, Any]) -> None:
        self.sinks.log(record)

    def on_step_end(self, trainer: Trainer) -> None:
        self.sinks.advance()

    def on_validation(self, trainer: Trainer, loss: float) -> None:
        self.sinks.log_validation(trainer.step, trainer.tokens, loss)

    def on_tasks(self, trainer: Trainer, scores: dict[str, float], seconds: float) -> None:
        self.sinks.log_tasks(trainer.step, trainer.tokens, scores, seconds)

    def on_rewind(self, trainer: Trainer, step: int) -> None:
        self.sinks.rewind(step)

    def on_failure(self, trainer: Trainer, error: BaseException) -> None:
        if self.sinks is not None:
            self.sinks.close()

    def on_end(self, trainer: Trainer, summary: TrainSummary) -> None:
        self.sinks.close()
        cfg = trainer.cfg
        trainer.out(
            f"done: step {summary.step:,}, {summary.tokens:,} tokens, final loss {summary.final_loss:.4f} "
            f"(ln vocab = {math.log(cfg.model.vocab_size):.3f})"
            + (f"; loss plot {summary.plot}" if summary.plot else "")
        )


class LossPlot(Callback):
    """loss.png (train.plot) from metrics.jsonl, on global rank 0, when the run ends."""

    def on_end(self, trainer: Trainer, summary: TrainSummary) -> None:
        cfg = trainer.cfg
        summary.plot = plot_loss(trainer.run_dir, f"{cfg.name}: {count_params(cfg.model) / 1e6:,.1f}M params")
