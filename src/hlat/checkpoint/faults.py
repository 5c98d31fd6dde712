"""Fault injection for the failure tests: kill or freeze this process at a chosen point, once.

HLAT_FAULT="PHASE:STEP:RANK" strikes global rank RANK:
  - phase "step":   SIGKILL (no cleanup, like a lost node) before optimizer step STEP runs (after
                    step STEP-1 and its checkpoint);
  - phase "commit": SIGKILL while saving the checkpoint of step STEP, after its data is written
                    and before it is committed (the manifest and the rename);
  - phase "hang":   before optimizer step STEP, the rank sleeps forever (alive but silent, like a
                    stuck node), so the others' collectives time out (hlat.parallel.hang).
HLAT_FAULT_MARKER=FILE is created just before the fault; while it exists nothing fires, so the
group that torchrun restarts runs through. Unset, this module does nothing.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

_POINT = {"hang": "step"}  # faults that strike at another phase's point in the loop


def maybe_kill(phase: str, step: int, rank: int) -> None:
    spec = os.environ.get("HLAT_FAULT")
    if not spec:
        return
    fault, want_step, want_rank = spec.split(":")
    if (phase, step, rank) != (_POINT.get(fault, fault), int(want_step), int(want_rank)):
        return
    marker = Path(os.environ.get("HLAT_FAULT_MARKER", ".hlat-fault-done"))
    if marker.exists():
        return
    marker.write_text(f"{'froze' if fault == 'hang' else 'killed'} rank {rank} at {fault} {step}\n")
    if fault == "hang":
        while True:
            time.sleep(3600)
    os.kill(os.getpid(), signal.SIGKILL)
