"""`[elastic]`: data parallelism over replica groups that may leave and rejoin (torchft; hlat.train.elastic)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_FILE_PART = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass
class ElasticConfig:
    """`[elastic]`: replica groups (one torchrun job each) run by torchft's lighthouse; a group
    that dies drops out at the next step and one that comes back rejoins from a live peer."""

    enabled: bool = False
    """Train as one replica group of an elastic run (needs `pip install 'hlat[elastic]'`)."""
    lighthouse: str = ""
    """The torchft lighthouse's address, e.g. http://host:29510 (`hlat lighthouse` starts one)."""
    group: str = ""
    """This replica group's name, unique in the run (e.g. its Slurm job step or pod set); the
    token record and the log name groups by it."""
    min_groups: int = 1
    """Groups that must be present for a step to commit; with fewer the step waits for more."""
    max_groups: int = 1
    """Data shares the global batch is split into, one per group when all are present; with
    fewer groups the survivors take the missing groups' shares. Fixed for the run."""
    timeout_s: float = 60.0
    """How long a step waits for the quorum and for a collective before the groups it waits on
    are dropped (a hung or lost group)."""

    def validate(self) -> list[tuple[str, str]]:
        if not self.enabled:
            return []
        problems = []
        if not self.lighthouse:
            problems.append(("lighthouse", "give the lighthouse's address (start one with `hlat lighthouse`)"))
        if not self.group:
            problems.append(("group", "name this replica group, unique in the run (e.g. --elastic.group 0)"))
        elif not _FILE_PART.fullmatch(self.group) or self.group in (".", ".."):
            problems.append(
                (
                    "group",
                    f"{self.group!r} names files (tokens.GROUP.jsonl): use letters, digits, '.', '_' and '-' only",
                )
            )
        if self.min_groups < 1:
            problems.append(("min_groups", f"must be >= 1, got {self.min_groups}"))
        if self.max_groups < self.min_groups:
            problems.append(("max_groups", f"{self.max_groups} is below elastic.min_groups={self.min_groups}"))
        if self.timeout_s <= 0:
            problems.append(("timeout_s", f"must be > 0 seconds, got {self.timeout_s}"))
        return problems
