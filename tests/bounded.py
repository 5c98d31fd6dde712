"""Running a hostile case where a containment failure cannot take the test run down: a fresh
Python process under an address-space limit (no core file) and a wall-clock timeout.

`run_bounded(code)` runs `python -c code` with this process's environment (so the same sources
are imported) and returns the finished process; a hang past `timeout` fails the test instead of
freezing the suite. `PEAK_RSS` is a line of code that prints the child's peak resident memory in
MiB after what came before it, for tests that assert memory stayed bounded.
"""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

PEAK_RSS = "import resource; print('peak_mib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)"


def _limits(address_space: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_bounded(code: str, timeout: float = 60, address_space_gib: float = 4) -> subprocess.CompletedProcess[str]:
    limit = int(address_space_gib * (1 << 30))
    try:
        return subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=lambda: _limits(limit),
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the hostile case ran past {timeout} s (killed): {e.stderr!r}")


def peak_mib(proc: subprocess.CompletedProcess[str]) -> int:
    return int(next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("peak_mib")))
