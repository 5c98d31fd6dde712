"""Run one hostile case in a forked child under a memory and CPU limit and a wall clock, so that a
containment failure fails its own assertion instead of taking the test run down with it."""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20


@dataclass(frozen=True)
class Outcome:
    kind: str  # "returned", "raised" (error is "Type: message"), "killed" or "timeout"
    value: Any = None
    error: str = ""
    seconds: float = 0.0


def _address_space() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def contained(fn: Callable[..., Any], *args: Any, memory_mb: int = 1024, timeout_s: float = 30.0) -> Outcome:
    """fn(*args) in a child that may grow by `memory_mb` and run `timeout_s`; its JSON-able return
    value, or the exception it raised, or how it was stopped."""
    read, write = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test run
        try:
            os.close(read)
            limit = _address_space() + memory_mb * MIB
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            resource.setrlimit(resource.RLIMIT_CPU, (int(timeout_s) + 1, int(timeout_s) + 1))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            t0 = time.monotonic()
            try:
                message = ["returned", fn(*args), "", time.monotonic() - t0]
            except BaseException as err:  # noqa: BLE001 - reported to the test
                message = ["raised", None, f"{type(err).__name__}: {err}"[:4000], time.monotonic() - t0]
            os.write(write, json.dumps(message).encode())
        finally:
            os._exit(0)
    os.close(write)
    chunks: list[bytes] = []
    try:
        while True:
            left = timeout_s + 5 - (time.monotonic() - start)
            if left <= 0 or not select.select([read], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return Outcome("timeout", seconds=time.monotonic() - start)
            chunk = os.read(read, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return Outcome("killed", error=f"wait status {status}", seconds=time.monotonic() - start)
    kind, value, error, seconds = json.loads(b"".join(chunks))
    return Outcome(kind, value, error, seconds)
