"""This process's place among torchrun's, read from its environment: no torch, so that the
commands can validate their configuration before anything slow is imported."""

from __future__ import annotations

import os


def world_from_env() -> tuple[int, int, int]:
    """(world size, global rank, local rank) as set by torchrun; a plain run is (1, 0, 0)."""
    return int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
