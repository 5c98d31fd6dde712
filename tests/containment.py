"""Running a hostile case so that a containment failure fails its own assertion instead of taking
the test run down: under an address-space limit (no core file) and a wall clock.

Two ways, one set of limits:
- `contained(fn, *args)` forks: cheap (nothing is imported again), for cases in Python code. The
  child may grow by `memory_mb` over what the test process already maps.
- `run_bounded(code)` starts a fresh interpreter (`python -c code`, this process's environment, so
  the same sources are imported), for cases that can crash native code (a SIGBUS in a mapped
  file) or that must measure their own peak memory (`PEAK_RSS` prints it, `peak_mib` reads it).
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

MIB = 1 << 20
PEAK_RSS = "import resource; print('peak_mib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)"


def _limit(address_space: int, cpu_s: int | None = None) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cpu_s is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))


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
    """fn(*args) in a forked child that may grow by `memory_mb` and run `timeout_s`; its JSON-able
    return value, or the exception it raised, or how it was stopped."""
    read, write = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test run
        try:
            os.close(read)
            _limit(_address_space() + memory_mb * MIB, int(timeout_s) + 1)
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


def run_bounded(code: str, timeout: float = 60, address_space_gib: float = 4) -> subprocess.CompletedProcess[str]:
    """`python -c code` under an address space of `address_space_gib`; a hang past `timeout` fails
    the test."""
    limit = int(address_space_gib * (1 << 30))
    try:
        return subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=lambda: _limit(limit),
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the hostile case ran past {timeout} s (killed): {e.stderr!r}")


def peak_mib(proc: subprocess.CompletedProcess[str]) -> int:
    """The last peak the child printed (PEAK_RSS), in MiB."""
    return int([line.split()[1] for line in proc.stdout.splitlines() if line.startswith("peak_mib")][-1])
