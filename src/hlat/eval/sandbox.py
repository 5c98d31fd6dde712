"""Running generated code so that nothing it does can make it pass or reach the machine.

Each program is two processes, both isolated from the operating system as far as this machine
allows, the same way (sandbox_isolation.py, sandbox_confine.py). The solution process S
(sandbox_solution.py) runs the untrusted solution, and then answers calls to its functions over
a pipe. The test process T (sandbox_judge.py) runs only the dataset's test code, with the
solution's functions bound to proxies that call into S; values cross as plain data
(sandbox_wire.py). The test code comes from a task file, data a user downloaded, so T gets no
more of the host than S. The verdict is T's exit status: S can print, exit early or lie in any
way, but it can only ever hand T return values to check. Both are killed at the wall-clock
timeout, each with its whole PID namespace.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hlat.eval import sandbox_isolation as isolation

HERE = Path(__file__).parent
SOLUTION = str(HERE / "sandbox_solution.py")
JUDGE = str(HERE / "sandbox_judge.py")
MIB = 1 << 20
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}


class UnsafeCodeRefused(ValueError):
    """Generated code would run without isolation and nobody opted in."""


class SandboxError(RuntimeError):
    """The sandbox itself failed (a file it could not write, a mount it could not make), not the
    program: raised, so that a broken harness never scores programs as failed."""


@dataclass(frozen=True)
class Program:
    """A generated solution and the dataset's test that judges it. The test sees the solution's
    top-level functions as proxies: `entry_point` alone when given (HumanEval's `candidate`),
    else every function the solution defines that is not a builtin's name (MBPP's asserts)."""

    solution: str  # untrusted: runs in S
    test: str  # the dataset's: runs in T, confined as S is (a task file is not trusted either)
    prelude: str = ""  # the dataset's code T runs first (HumanEval: the prompt, for its helpers)
    entry_point: str = ""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock per program (solution and test together)
    memory_mb: int = 1024  # address space of each process
    file_mb: int = 16  # largest file the solution may write
    scratch_mb: int = 64  # all the files it may write together (its scratch directory)
    # processes and threads of the solution's uid: 1, no fork and no thread, so that memory_mb
    # holds for the solution as a whole (namespaces mode, where it has a uid of its own)
    processes: int = 1


@dataclass(frozen=True)
class ExecResult:
    passed: bool
    status: str  # "passed", "failed" or "timeout"
    detail: str  # the end of the test's error and of the solution's output, for the samples log


@functools.cache
def isolation_mode() -> str:
    """isolation.NAMESPACES when a probe program passes in namespaces here, else isolation.NONE;
    detected once per process."""
    if not isolation.unshare_available():
        return isolation.NONE
    probe = Program("def f():\n    return 1\n", "assert f() == 1\n")
    try:
        ok = _run(probe, SandboxLimits(timeout_s=30.0), isolation.NAMESPACES).passed
    except SandboxError:  # e.g. a tmpfs or bind mount refused here
        ok = False
    return isolation.NAMESPACES if ok else isolation.NONE


def isolation_summary(mode: str) -> str:
    """One line for the console and the results: what the solution and test processes run inside."""
    if mode == isolation.NAMESPACES:
        who = "each an unprivileged uid of its own" if os.geteuid() == 0 else "a user namespace"
        return (
            "namespaces, for the solution and the test code alike (mount, network, PID, IPC, UTS; "
            f"read-only root of the interpreter, its libraries and a scratch directory; {who}; "
            "resource limits)"
        )
    return "none (ordinary subprocesses with resource limits; allowed by explicit opt-in)"


def require_isolation(allow_unsafe: bool = False) -> str:
    """The mode programs will run in; UnsafeCodeRefused where there is no isolation and no opt-in."""
    mode = isolation_mode()
    if mode == isolation.NONE and not isolation.unsafe_code_allowed(allow_unsafe):
        raise UnsafeCodeRefused(
            "code tasks run generated programs, and this machine gives them no isolation "
            "(`unshare` with mount, network and PID namespaces is missing or refused, e.g. by a "
            "container's seccomp profile), so they would run with all the rights of this user. "
            "Run in a throwaway container or VM, then opt in with `hlat eval --allow-unsafe-code` "
            f"or {isolation.UNSAFE_ENV}=1 (see docs/evaluation.md)"
        )
    return mode


def run_program(program: Program, limits: SandboxLimits = SandboxLimits(), allow_unsafe: bool = False) -> ExecResult:
    return _run(program, limits, require_isolation(allow_unsafe))


def run_programs(
    programs: Sequence[Program], limits: SandboxLimits = SandboxLimits(), workers: int = 4, allow_unsafe: bool = False
) -> list[ExecResult]:
    """Run programs in parallel (threads only wait on their subprocesses)."""
    mode = require_isolation(allow_unsafe)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda p: _run(p, limits, mode), programs))


def _run(program: Program, limits: SandboxLimits, mode: str) -> ExecResult:
    with tempfile.TemporaryDirectory(prefix="hlat-sandbox-") as work:
        scratch = Path(work, "scratch")
        scratch.mkdir()
        Path(scratch, "solution.py").write_text(program.solution, encoding="utf-8")
        calls_r, calls_w = os.pipe()
        answers_r, answers_w = os.pipe()
        setup_r, setup_w = os.pipe()  # S writes "ok" on it once confined, before the solution runs
        solution = judge = None
        try:
            solution = _start_solution(program, limits, mode, Path(work), calls_r, answers_w, setup_w)
            judge = _start_judge(program, limits, mode, Path(work), calls_w, answers_r)
        finally:
            for fd in (calls_r, calls_w, answers_r, answers_w, setup_w):
                os.close(fd)  # only S and T hold the channel: either one ending ends it
            try:
                status = "timeout" if judge is not None else "failed"
                if judge is not None:
                    status = _wait(judge, limits, scratch if mode == isolation.NONE else None)
            finally:
                _stop(solution)
                _stop(judge)
                confined = _read_all(setup_r) == b"ok"
        detail = _tail(Path(work, "judge.err")) if status != "passed" else ""
        output = _tail(Path(work, "solution.out"))
        if judge is not None and judge.returncode not in (0, 1) and status == "failed":
            raise SandboxError(f"the test process ended with status {judge.returncode}: {detail[-500:]}")
        if not confined and status != "passed":
            raise SandboxError(f"the solution process could not be set up: {output[-500:]}")
        if status == "quota":
            status, detail = "failed", f"the solution wrote more than {limits.scratch_mb} MiB of files"
        if status != "passed" and output:
            detail += f"\n--- solution output ---\n{output}"
        return ExecResult(status == "passed", status, detail[-1500:])


def _wait(judge: subprocess.Popen[bytes], limits: SandboxLimits, scratch: Path | None) -> str:
    """ "passed", "failed", "timeout", or "quota" when `scratch` (given without namespaces, where no
    tmpfs bounds it) grew past limits.scratch_mb."""
    deadline = time.monotonic() + limits.timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            judge.wait(timeout=max(0.0, min(left, 0.1) if scratch is not None else left))
            return "passed" if judge.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            if left <= 0:
                return "timeout"
            if scratch is not None and _usage(scratch) > limits.scratch_mb * MIB:
                return "quota"


def _usage(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass  # removed meanwhile
    return total


def _read_all(fd: int) -> bytes:
    """What S wrote on the setup pipe (every writer is gone by now), then the pipe closed."""
    try:
        os.set_blocking(fd, False)
        return os.read(fd, 16)
    except BlockingIOError:
        return b""
    finally:
        os.close(fd)


def _start_solution(
    program: Program, limits: SandboxLimits, mode: str, work: Path, calls: int, answers: int, setup: int
) -> subprocess.Popen[bytes]:
    scratch = work / "scratch"
    config = {
        "calls_fd": calls,
        "answers_fd": answers,
        "setup_fd": setup,
        "isolation": _isolation(mode, limits, work / "root", True, [str(scratch / "solution.py")]),
        "site_packages": isolation.site_packages(),
        "limits": _limits(limits),
    }
    confined = config["isolation"] is not None
    return _launch(
        SOLUTION, json.dumps(config), confined, scratch, work / "solution.out", True, (calls, answers, setup)
    )


def _start_judge(
    program: Program, limits: SandboxLimits, mode: str, work: Path, calls: int, answers: int
) -> subprocess.Popen[bytes]:
    # outside S's scratch directory, and read by T before it confines itself: S never sees the
    # test, and the confined T needs no access to it
    spec = work / "judge.json"
    config = {
        "calls_fd": calls,
        "answers_fd": answers,
        "test": program.test,
        "prelude": program.prelude,
        "entry_point": program.entry_point,
        "isolation": _isolation(mode, limits, work / "judge-root", False, []),
        "limits": _limits(limits),
    }
    spec.write_text(json.dumps(config))
    confined = config["isolation"] is not None
    return _launch(JUDGE, str(spec), confined, work, work / "judge.err", False, (calls, answers))


def _isolation(mode: str, limits: SandboxLimits, root: Path, packages: bool, files: list[str]) -> dict[str, Any] | None:
    """How sandbox_confine.enter confines a process: None in mode "none"; `packages`: may read
    site-packages (the solution, not the test); `files`: copied into its scratch directory."""
    if mode != isolation.NAMESPACES:
        return None
    readable, links = isolation.readable_paths(packages)
    root.mkdir()
    return {
        "root": str(root),
        "files": files,
        "readable": readable,
        "links": links,
        "uid": isolation.sandbox_uid(),
        "scratch_mb": limits.scratch_mb,
    }


def _limits(limits: SandboxLimits) -> dict[str, int]:
    return {
        "memory_mb": limits.memory_mb,
        "cpu_s": int(limits.timeout_s) + 1,
        "file_mb": limits.file_mb,
        "processes": limits.processes,
    }


def _launch(
    script: str, argument: str, confined: bool, cwd: Path, log: Path, keep_stdout: bool, fds: tuple[int, ...]
) -> subprocess.Popen[bytes]:
    """Start a sandbox script, under `unshare` when `confined`: then its stdin is the keeper's
    lifeline (_stop), and its scratch directory, /sandbox, is its HOME and TMPDIR."""
    command = [sys.executable, "-I", "-S", "-B", script, argument]
    home = "/sandbox" if confined else str(cwd)
    with open(log, "wb") as err:
        return subprocess.Popen(
            isolation.unshare_command() + command if confined else command,
            cwd=cwd,
            env={**ENV, "HOME": home, "TMPDIR": home},
            stdin=subprocess.PIPE if confined else subprocess.DEVNULL,
            stdout=err if keep_stdout else subprocess.DEVNULL,  # S's prints: the samples log
            stderr=err,
            pass_fds=fds,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    """End a process and everything it started. For an isolated S, closing its keeper's stdin
    makes the keeper kill the namespace's first process, and with it the whole namespace."""
    if proc is None:
        return
    if proc.stdin is not None:
        proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _tail(path: Path, size: int = 1000) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - size))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""
