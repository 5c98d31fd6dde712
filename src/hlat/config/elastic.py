"""`[elastic]`: data parallelism over replica groups that may leave and rejoin (torchft; hlat.train.elastic)."""

from __future__ import annotations

import ipaddress
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
    are dropped (a hung or lost group); also how often a group says again which peer it refuses."""
    bind_address: str = ""
    """The one address of this machine that the group's sockets listen on (its store and state
    server), e.g. its address on the cluster network; empty: the address it reaches the lighthouse
    from. torchft's manager server listens on every interface regardless (docs/operations.md)."""
    secret_file: str = ""
    """A file holding the run's secret, readable by its owner only (`hlat elastic-secret FILE`
    creates one; every group of the run reads the same secret). Groups prove it to each other before
    one sends another its state or commits a step with it. Only this name is ever logged or saved."""
    secret_env: str = ""
    """Instead of elastic.secret_file: the name of an environment variable holding the secret."""
    trusted_network: bool = False
    """Run without a secret: only where nothing but the run's own machines can reach the lighthouse
    and the groups (any process that reaches them can then read or replace the model; docs/operations.md)."""

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
        if self.bind_address:
            problems.extend(_bind_problems(self.bind_address))
        if self.secret_file and self.secret_env:
            problems.append(("secret_env", "give elastic.secret_file or elastic.secret_env, not both"))
        if not (self.secret_file or self.secret_env or self.trusted_network):
            problems.append(
                (
                    "secret_file",
                    "an elastic run needs a secret its groups share: create one with `hlat elastic-secret FILE` and give "
                    "--elastic.secret_file FILE (or set elastic.trusted_network true on a network only the run reaches)",
                )
            )
        if self.timeout_s <= 0:
            problems.append(("timeout_s", f"must be > 0 seconds, got {self.timeout_s}"))
        return problems


def _bind_problems(address: str) -> list[tuple[str, str]]:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return [("bind_address", f"{address!r} is not an IP address: give one address of this machine, e.g. 10.0.0.5")]
    if ip.is_unspecified:
        return [("bind_address", f"{address} is every interface: give one address of this machine, e.g. 10.0.0.5")]
    return []
