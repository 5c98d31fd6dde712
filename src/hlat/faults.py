"""Fault injection for the failure tests: kill, freeze, fail or slow this process at a chosen point.
Nothing happens unless HLAT_TESTING=1 (the test suite sets it) and HLAT_FAULT is set
(HLAT_FAULT_MARKER only qualifies it): every hook below returns at once otherwise, so a stray
HLAT_FAULT in a production environment does nothing. A malformed HLAT_FAULT under HLAT_TESTING is
one line (FaultSpecError, a UserError: exit 2).

HLAT_FAULT="FAULT:STEP:RANK" strikes global rank RANK, once:
  - "step":   SIGKILL (no cleanup, like a lost node) before optimizer step STEP runs (after
              step STEP-1 and its checkpoint);
  - "commit": SIGKILL while saving the checkpoint of step STEP, after its data is written
              and before it is committed (the manifest and the rename);
  - "writing": SIGKILL while the background (checkpoint.async_save) save of step STEP is in
              flight: DCP's writer thread started, training went on, nothing hashed or committed;
  - "sigint", "sigterm", "sighup": that signal, sent to itself before optimizer step STEP runs (a
              Ctrl-C, a preemption, a closed terminal; "sigint:STEP:RANK:N" sends it N times back to back);
  - "hang":   before optimizer step STEP, the rank sleeps forever (alive but silent, like a
              stuck node), so the others' collectives time out (hlat.parallel.hang);
  - "hang-compute": the same, inside optimizer step STEP once its data is read (in an elastic
              run: after the step's quorum and position exchange, before its first all-reduce);
  - "fail-mkdir", "fail-write", "fail-hash", "fail-commit": raise OSError in that step of
              saving the checkpoint of step STEP (rank 0 creating the temporary directory, a rank
              writing its rank/shared files, a rank hashing its files, rank 0 committing), like
              a full disk or a lost mount; the save must then fail on every rank.
HLAT_FAULT_MARKER=FILE is created just before the fault; while it exists nothing fires, so the
group that torchrun restarts runs through.

HLAT_FAULT="slow:STEP:RANK:SECONDS" makes rank RANK a slow node from optimizer step STEP on: every
step it burns SECONDS more of CPU time (not wall time, so the delay is the same on a loaded
machine), inside the step, as compute (hlat.parallel.slow_ranks must name it). It never writes a
marker: a slow node stays slow.

HLAT_FAULT="flip:STEP:RANK" makes rank RANK compute wrong without crashing (silent data corruption):
in optimizer step STEP of a train.deterministic run, one bit of the first transformer block's
output flips in its first micro-batch; recomputing that micro-batch anywhere gives the right bits
(hlat.train.replay must name the rank). No marker: it is not a process fault.

HLAT_ELASTIC_HOLD="STEP:GROUPS[,STEP:GROUPS...]" makes an elastic group (elastic.enabled) wait
before optimizer step STEP until GROUPS replica groups are present, so that a test knows which
groups train which steps (all groups at the first step; a restarted group back before a later one), for at most HOLD_TIMEOUT_S,
once per step (a retry of the step that did not commit does not wait again).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from hlat.errors import UserError

_SAVE_STEPS = ("mkdir", "write", "hash", "commit")
HOLD_TIMEOUT_S = 300.0  # a process started on a loaded machine may take a minute to join
_SIGNALS = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sighup": signal.SIGHUP}
_POINT = {
    "hang": "step",
    "hang-compute": "compute",
    **dict.fromkeys(_SIGNALS, "step"),
    **{f"fail-{point}": point for point in _SAVE_STEPS},
}  # where each fault strikes


TESTING_ENV = "HLAT_TESTING"
_KILLS = ("step", "commit", "writing")
_USAGE = (
    "FAULT:STEP:RANK with FAULT one of "
    + ", ".join([*_KILLS, *_POINT, "flip"])
    + " (sigint/sigterm/sighup take an optional "
    ":COUNT), or slow:STEP:RANK:SECONDS"
)


class FaultSpecError(UserError, ValueError):
    """A malformed HLAT_FAULT."""


def fault_spec() -> tuple[str, int, int, float | None] | None:
    """(fault, step, rank, extra) of HLAT_FAULT, or None when there is none or HLAT_TESTING is not
    1; `extra` is sigint/sigterm/sighup's count or slow's seconds. Malformed: FaultSpecError."""
    spec = os.environ.get("HLAT_FAULT")
    if not spec or os.environ.get(TESTING_ENV) != "1":
        return None
    parts = spec.split(":")
    fault = parts[0]
    lengths = {"slow": (4,), **dict.fromkeys(_SIGNALS, (3, 4))}.get(fault, (3,))
    try:
        if fault not in (*_KILLS, *_POINT, "slow", "flip") or len(parts) not in lengths:
            raise ValueError
        step, rank = int(parts[1]), int(parts[2])
        extra = None if len(parts) == 3 else (float(parts[3]) if fault == "slow" else int(parts[3]))
        if step < 0 or rank < 0 or (extra is not None and not extra >= 0):
            raise ValueError
    except ValueError:
        raise FaultSpecError(f"HLAT_FAULT={spec!r}: expected {_USAGE}") from None
    return fault, step, rank, extra


def _strikes(point: str, step: int, rank: int, raising: bool) -> str | None:
    """The fault that strikes here and now, if any, among the raising ones or the others; its
    marker is written first."""
    spec = fault_spec()
    if spec is None:
        return None
    fault, want_step, want_rank, _ = spec
    if fault in ("slow", "flip") or fault.startswith("fail-") != raising:
        return None
    if (point, step, rank) != (_POINT.get(fault, fault), want_step, want_rank):
        return None
    marker = Path(os.environ.get("HLAT_FAULT_MARKER", ".hlat-fault-done"))
    if marker.exists():
        return None
    verb = {"hang": "froze", "hang-compute": "froze", "step": "killed", "commit": "killed", "writing": "killed"}
    verb = verb.get(fault, "signalled" if fault in _SIGNALS else "failed")
    marker.write_text(f"{verb} rank {rank} at {fault} {step}\n")
    return fault


def maybe_kill(phase: str, step: int, rank: int) -> None:
    """SIGKILL, freeze or signal at `phase` ("step", "compute", "commit", "writing") when HLAT_FAULT asks."""
    fault = _strikes(phase, step, rank, raising=False)
    if fault is None:
        return
    if fault.startswith("hang"):
        while True:
            time.sleep(3600)
    if fault in _SIGNALS:
        count = fault_spec()[3]  # type: ignore[index]  (it struck: there is a spec)
        for _ in range(int(count) if count is not None else 1):
            os.kill(os.getpid(), _SIGNALS[fault])
        return
    os.kill(os.getpid(), signal.SIGKILL)


def maybe_fail(point: str, step: int, rank: int) -> None:
    """Raise OSError at save step `point` (mkdir, write, hash or commit) when HLAT_FAULT asks."""
    if _strikes(point, step, rank, raising=True):
        raise OSError(f"injected fault fail-{point} (HLAT_FAULT) at step {step} on rank {rank}")


def flips(step: int, rank: int) -> bool:
    """Whether HLAT_FAULT="flip:STEP:RANK" asks this rank to compute step `step`'s first micro-batch wrong."""
    spec = fault_spec()
    return spec is not None and spec[0] == "flip" and (spec[1], spec[2]) == (step, rank)


def maybe_slow(step: int, rank: int) -> None:
    """Burn the CPU time HLAT_FAULT="slow:FROM:RANK:SECONDS" asks for, on that rank from step FROM on."""
    spec = fault_spec()
    if spec is None or spec[0] != "slow":
        return
    _, from_step, want_rank, seconds = spec
    if rank == want_rank and step >= from_step:
        end = time.thread_time() + float(seconds or 0.0)
        while time.thread_time() < end:
            pass


def hold_groups(step: int) -> int:
    """The replica groups HLAT_ELASTIC_HOLD asks to wait for before optimizer step `step` (0: none);
    like every hook here, only under HLAT_TESTING=1, and a malformed value is one line."""
    spec = os.environ.get("HLAT_ELASTIC_HOLD", "")
    if not spec or os.environ.get(TESTING_ENV) != "1":
        return 0
    for item in filter(None, spec.split(",")):
        want_step, _, groups = item.partition(":")
        if not (want_step.isdigit() and groups.isdigit()):
            raise FaultSpecError(f"HLAT_ELASTIC_HOLD={spec!r}: give STEP:GROUPS[,STEP:GROUPS...] (tests only)")
        if int(want_step) == step:
            return int(groups)
    return 0
