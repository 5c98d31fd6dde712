"""`[profile]`: which training steps torch.profiler traces (hlat.metrics.profiling runs it)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_STEPS = re.compile(r"\s*(\d+)\s*:\s*(\d+)\s*")


@dataclass
class ProfileConfig:
    """`[profile]`: which training steps torch.profiler traces."""

    steps: str = ""
    """The optimizer steps to trace: "A:B" traces steps A to B (1-based, inclusive); "" = no profile."""
    dir: str = ""
    """Where the traces go; "" = <run_dir>/profile."""

    def range(self) -> tuple[int, int] | None:
        """(A, B), or None when off; assumes validate() passed."""
        match = _STEPS.fullmatch(self.steps)
        return (int(match[1]), int(match[2])) if match else None

    def validate(self) -> list[tuple[str, str]]:
        if not self.steps:
            return []
        match = _STEPS.fullmatch(self.steps)
        if match is None or not 1 <= int(match[1]) <= int(match[2]):
            return [
                (
                    "steps",
                    f"got {self.steps!r}; write A:B with 1 <= A <= B, the first and last optimizer step to "
                    'trace (e.g. --profile.steps 5:7), or "" for none',
                )
            ]
        return []
