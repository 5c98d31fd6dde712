"""Interrupts during training. SIGINT (Ctrl-C), SIGTERM (a scheduler's preemption, or torchrun
passing either on) or SIGHUP (the terminal or ssh session closed) ends the run at the next step boundary with a checkpoint of that step, if the
step ends and the checkpoint is written within train.interrupt_save_s of the signal. A second
signal, or the deadline, stops at once and saves nothing.

A signal reaches the ranks of a job at different moments, or only some of them, so at every step
boundary the ranks agree, by an all-reduce of one number on a gloo group of their own (host memory:
it never waits for the accelerator), and all stop after the same step. A terminal's Ctrl-C reaches
torchrun's workers directly and again through torchrun: a signal within SAME_SIGNAL_S of the first
is the same interrupt.
"""

from __future__ import annotations

import _thread
import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Any

import torch
import torch.distributed as dist

from hlat.parallel.mesh import Layout, collective_timeout

# SIGHUP: a closed terminal or ssh session, which should not cost the step as a kill would
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SAME_SIGNAL_S = 1.0


class Interrupted(KeyboardInterrupt):
    """Training stopped on a signal; the message says where a resume starts."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.signum = signum


class Interrupts:
    """The signal handlers around the training loop (installed from the main thread only; elsewhere
    the signals keep theirs). Collective to build and to ask (`stop_agreed`)."""

    def __init__(self, deadline_s: float, layout: Layout):
        self.deadline_s = deadline_s
        self.signum = 0  # the first signal this rank received, or that another rank reported
        self.requested = ""  # why this rank asked the run to stop (request), or "another rank asked"
        self.aborted = ""  # why the run stops without saving
        self._received_at = 0.0
        self._deadline_passed = False
        self._timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}
        self._group = dist.new_group(backend="gloo", timeout=collective_timeout()) if layout.world > 1 else None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "interrupt"

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.disarm()
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def disarm(self) -> None:
        """The checkpoint is written: the deadline no longer applies."""
        if self._timer is not None:
            self._timer.cancel()

    def request(self, why: str) -> None:
        """Stop at the next step boundary with a checkpoint, as on a signal (e.g. a sink's disk is full)."""
        self.requested = self.requested or why

    def stop_agreed(self) -> bool:
        """At a step boundary, on every rank: whether any rank was interrupted or asked to stop."""
        if self._group is not None:
            flags = torch.tensor([self.signum, int(bool(self.requested))])
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._group)
            self.signum = self.signum or int(flags[0].item())
            self.requested = self.requested or ("another rank asked to stop" if flags[1].item() else "")
        return bool(self.signum or self.requested)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self._deadline_passed:
            self._abort(f"the step did not end and save within train.interrupt_save_s={self.deadline_s:g} s")
        if self.signum and self._received_at:
            if now - self._received_at >= SAME_SIGNAL_S:
                self._abort("a second signal")
            return
        self.signum, self._received_at = signum, now
        if self.deadline_s <= 0:
            self._abort("train.interrupt_save_s = 0")
        self._timer = threading.Timer(self.deadline_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        self._deadline_passed = True
        _thread.interrupt_main(self.signum)  # _handle runs on the main thread, and aborts

    def _abort(self, why: str) -> None:
        self.aborted = why
        raise KeyboardInterrupt
