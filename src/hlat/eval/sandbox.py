"""Running untrusted generated code: a subprocess per program, in its own session, with a wall-clock
timeout that kills its whole process group, CPU/memory/file-size limits, a fresh temporary
directory as cwd and HOME, a minimal environment, no network, and writes confined to that
directory.

No network has two layers: a new network namespace (`unshare -rn`, which has only a loopback
device) where the kernel allows it, and always the audit hook of sandbox_guard.py, which refuses
to create sockets. The audit hook is what confines writes; it stops Python code, which is what
the model writes, but it is not a boundary against native code, so run evaluations of untrusted
models in a container as well.
"""

from __future__ import annotations

import functools
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

GUARD = (Path(__file__).parent / "sandbox_guard.py").read_text()


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock per program
    memory_mb: int = 1024  # address space
    file_mb: int = 16  # largest file the program may write


@dataclass(frozen=True)
class ExecResult:
    passed: bool
    status: str  # "passed", "failed" or "timeout"
    detail: str  # the end of stderr, for the samples log


@functools.cache
def network_namespace_available() -> bool:
    """Whether `unshare -rn` works here (it needs user namespaces, or root)."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-rn", "--", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_program(program: str, limits: SandboxLimits = SandboxLimits()) -> ExecResult:
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="hlat-sandbox-") as root:
        Path(root, "program.py").write_text(program, encoding="utf-8")
        cmd = [sys.executable, "-I", "-B", "-c", GUARD, root, "program.py", str(limits.memory_mb),
               str(math.ceil(limits.timeout_s) + 1), str(limits.file_mb)]
        if network_namespace_available():
            cmd = ["unshare", "-rn", "--", *cmd]
        env = {"PATH": "/usr/bin:/bin", "HOME": root, "TMPDIR": root, "LANG": "C.UTF-8",
               "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)  # its own process group, killed below
        try:
            out, err = proc.communicate(token.encode() + b"\n", timeout=limits.timeout_s)
            status = "passed" if proc.returncode == 0 and _finished(out, token) else "failed"
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, err = proc.communicate()
            status = "timeout"
        finally:
            _kill_group(proc.pid)  # anything it left running
    return ExecResult(status == "passed", status, err.decode(errors="replace")[-1000:])


def run_programs(programs: Sequence[str], limits: SandboxLimits = SandboxLimits(),
                 workers: int = 4) -> list[ExecResult]:
    """Run programs in parallel (threads only wait on their subprocesses)."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda p: run_program(p, limits), programs))


def _finished(stdout: bytes, token: str) -> bool:
    return stdout.rstrip().endswith(token.encode())


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
