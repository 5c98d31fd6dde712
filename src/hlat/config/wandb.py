"""`[wandb]`: Weights & Biases as a metrics sink (hlat.train.wandb_sink writes to it)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec

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
