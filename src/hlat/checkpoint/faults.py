"""Fault injection for the failure tests: kill this process at a chosen point, once.

HLAT_FAULT="PHASE:STEP:RANK" kills global rank RANK with SIGKILL (no cleanup, like a lost node)
  - phase "step":   before optimizer step STEP runs (after step STEP-1 and its checkpoint);
  - phase "commit": while saving the checkpoint of step STEP, after its data is written and
                    before it is committed (the manifest and the rename).
HLAT_FAULT_MARKER=FILE is created just before the kill; while it exists nothing is killed, so the
group that torchrun restarts runs through. Unset, this module does nothing.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def maybe_kill(phase: str, step: int, rank: int) -> None:
    spec = os.environ.get("HLAT_FAULT")
    if not spec:
        return
    want_phase, want_step, want_rank = spec.split(":")
    if (phase, step, rank) != (want_phase, int(want_step), int(want_rank)):
        return
    marker = Path(os.environ.get("HLAT_FAULT_MARKER", ".hlat-fault-done"))
    if marker.exists():
        return
    marker.write_text(f"killed rank {rank} at {phase} {step}\n")
    os.kill(os.getpid(), signal.SIGKILL)
