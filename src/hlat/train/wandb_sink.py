"""Weights & Biases as an optional metrics sink (the `wandb` extra): rank 0's records, as written
to metrics.jsonl, in a W&B run's history at their training step."""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

WANDB_MODES = ("", "online", "offline", "disabled")


@dataclass
class WandbConfig:
    enabled: bool = False
    project: str = "hlat"
    name: str = ""  # "" = the run's name (preset or config file); also the W&B group of its runs
    mode: str = ""  # "" = WANDB_MODE or online; "offline" writes under the run directory, for `wandb sync`

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        if self.mode not in WANDB_MODES:
            problems.append(("mode", f"got {self.mode!r}; choose one of online, offline, disabled, or \"\" for WANDB_MODE"))
        if self.enabled and not wandb_installed():
            problems.append(("enabled", "the wandb package is not installed; pip install 'hlat[wandb]' "
                                        "(or leave wandb.enabled false)"))
        return problems


def wandb_installed() -> bool:
    return find_spec("wandb") is not None


class WandbSink:
    """W&B cannot delete logged points, and ignores a step below one it has logged. So one W&B run
    holds one unbroken stretch of steps: `start(step)` finishes the current run and opens a new
    one, in the same group, whose history begins after `step`. MetricSinks calls it wherever the
    run continues from a step: at start-up (each resume is a new run) and on each rollback."""

    def __init__(self, cfg: WandbConfig, run_name: str, run_dir: Path, config: dict[str, Any]):
        import wandb

        self.wandb, self.cfg, self.config = wandb, cfg, config
        self.name = cfg.name or run_name
        # Under the run directory like the other sinks, unless the user points WANDB_DIR elsewhere.
        self.dir = os.environ.get("WANDB_DIR") or str(run_dir)
        self.run: Any = None

    def start(self, step: int) -> None:
        self.close()
        Path(self.dir).mkdir(parents=True, exist_ok=True)
        self.run = self.wandb.init(project=self.cfg.project, name=self.name if step == 0 else f"{self.name} from step {step}",
                                   group=self.name, dir=self.dir, mode=self.cfg.mode or None,
                                   config={**self.config, "start_step": step})

    def log(self, record: dict[str, Any]) -> None:
        self.run.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
