"""What a long wait prints: a phase's start line and a heartbeat while it runs (`Heartbeat`), and a
counting progress display (`progress`) that is a live bar on a terminal and, in a log (not a
terminal), one plain line per HEARTBEAT_S, so that neither is silent and neither spams a log file.

HLAT_HEARTBEAT_S (seconds, default 30) sets the interval of both.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from tqdm import tqdm

DEFAULT_HEARTBEAT_S = 30.0


def heartbeat_s() -> float:
    """HLAT_HEARTBEAT_S, else 30 s; a value that is not a positive number is ignored."""
    try:
        value = float(os.environ.get("HLAT_HEARTBEAT_S", ""))
    except ValueError:
        return DEFAULT_HEARTBEAT_S
    return value if value > 0 else DEFAULT_HEARTBEAT_S


def duration(seconds: float) -> str:
    """h:mm:ss (or m:ss under an hour): how elapsed time and ETAs read on the console."""
    s = max(int(round(seconds)), 0)
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Heartbeat:
    """`with Heartbeat("compile: probing one block", out):` prints "compile: probing one block ..."
    at once and, while the block runs, "... still running after 0:30" every heartbeat_s() seconds
    (from a daemon thread, so a phase that blocks in C code is still reported)."""

    def __init__(self, what: str, out: Callable[[str], None], interval_s: float | None = None):
        self.what, self.out = what, out
        self.interval_s = heartbeat_s() if interval_s is None else interval_s
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        self.out(f"{self.what} ...")
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._beat, name="hlat-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._done.wait(self.interval_s):
            self.out(f"{self.what}: still running after {duration(time.perf_counter() - self._started)}")

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


class LineProgress:
    """The non-terminal form of `progress`: tqdm's update/set_postfix/refresh/close, printing
    "DESC: N/TOTAL UNIT (P%), R UNIT/s, eta T" at most once per interval and once at the end."""

    def __init__(self, total: int | None, desc: str, unit: str, file: IO[str], interval_s: float):
        self.total, self.desc, self.unit, self.file, self.interval_s = total, desc, unit, file, interval_s
        self.n, self.postfix = 0, ""
        self._started = self._printed = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.perf_counter() - self._printed >= self.interval_s:
            self._print()

    def set_postfix(self, **fields: Any) -> None:
        self.postfix = ", ".join(f"{key} {value}" for key, value in fields.items())

    def refresh(self) -> None:
        """Nothing: a line is printed per interval and at close, not on demand."""

    def close(self) -> None:
        if self.n:
            self._print()

    def _print(self) -> None:
        now = time.perf_counter()
        self._printed = now
        rate = self.n / max(now - self._started, 1e-9)
        line = f"{self.desc}: {self.n:,}"
        if self.total:
            line += f"/{self.total:,} {self.unit} ({self.n / self.total:.0%})"
            eta = (self.total - self.n) / rate if rate > 0 else 0.0
            line += f", {rate:,.1f} {self.unit}/s, eta {duration(eta)}"
        else:
            line += f" {self.unit}, {rate:,.1f} {self.unit}/s"
        print(line + (f", {self.postfix}" if self.postfix else ""), file=self.file, flush=True)

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(
    total: int | None, desc: str, unit: str, enabled: bool = True, file: IO[str] | None = None, leave: bool = True
) -> tqdm | LineProgress:
    """A tqdm bar on a terminal (`file`, default stderr); elsewhere a LineProgress; disabled: a
    bar that prints nothing."""
    stream = file or sys.stderr
    if not enabled or stream.isatty():
        return tqdm(
            total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True, leave=leave, file=stream
        )
    return LineProgress(total, desc, unit, stream, heartbeat_s())
