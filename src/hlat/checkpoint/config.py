"""When checkpoints are written and how many are kept."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CheckpointConfig:
    every: int = 1000  # optimizer steps between checkpoints; the last step is always saved
    keep_last: int = 5  # older checkpoints are deleted once a newer one is complete
    verify: bool = True  # check sizes and SHA-256 checksums against the manifest when loading

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        if self.every < 1:
            problems.append(("every", f"must be >= 1, got {self.every}"))
        if self.keep_last < 1:
            problems.append(("keep_last", f"must be >= 1 (the newest checkpoint is what resume needs), got {self.keep_last}"))
        return problems
