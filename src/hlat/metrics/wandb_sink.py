"""Weights & Biases as an optional metrics sink (the `wandb` extra): rank 0's records, as written
to metrics.jsonl, in a W&B run's history at their training step."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hlat.atomic_files import make_dir
from hlat.config.wandb import WandbConfig
from hlat.metrics.sink import Sink


class WandbSink(Sink):
    """W&B cannot delete logged points, and ignores a step below one it has logged. So one W&B run
    holds one unbroken stretch of steps: `rewind(step)` finishes the current run and opens a new
    one, in the same group, whose history begins after `step`. MetricSinks calls it wherever the
    run continues from a step: at start-up (each resume is a new run) and on each rollback."""

    def __init__(self, cfg: WandbConfig, run_name: str, run_dir: Path, config: dict[str, Any]):
        import wandb

        self.wandb, self.cfg, self.config = wandb, cfg, config
        self.name = cfg.name or run_name
        # Under the run directory like the other sinks, unless the user points WANDB_DIR elsewhere.
        self.dir = os.environ.get("WANDB_DIR") or str(run_dir)
        self.target = f"W&B's files under {self.dir}"
        self.run: Any = None

    def rewind(self, step: int) -> None:
        self.close()
        make_dir(self.dir)
        self.run = self.wandb.init(
            project=self.cfg.project,
            name=self.name if step == 0 else f"{self.name} from step {step}",
            group=self.name,
            dir=self.dir,
            mode=self.cfg.mode or None,
            config={**self.config, "start_step": step},
        )

    def log(self, record: dict[str, Any]) -> None:
        self.run.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])

    log_validation = log_tasks = log

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
