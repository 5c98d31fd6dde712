"""`[wandb]`: Weights & Biases as a metrics sink (hlat.metrics.wandb_sink writes to it)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec
from typing import Literal

from hlat.config.fields import choices


@dataclass
class WandbConfig:
    """`[wandb]`: Weights & Biases as a metrics sink (the `wandb` extra)."""

    enabled: bool = False
    """Send every log record to Weights & Biases too."""
    project: str = "hlat"
    """The W&B project the runs go to."""
    name: str = ""
    """The W&B run name; "" = the run's name (preset or config file). Also the W&B group of its runs."""
    mode: Literal["", "online", "offline", "disabled"] = ""
    """The W&B mode: "" = WANDB_MODE or online; "offline" writes under the run directory, for
    `wandb sync`."""

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        if self.mode not in choices(WandbConfig, "mode"):
            problems.append(
                ("mode", f'got {self.mode!r}; choose one of online, offline, disabled, or "" for WANDB_MODE')
            )
        if self.enabled and not wandb_installed():
            problems.append(
                (
                    "enabled",
                    "the wandb package is not installed; pip install 'hlat[wandb]' (or leave wandb.enabled false)",
                )
            )
        return problems


def wandb_installed() -> bool:
    return find_spec("wandb") is not None
