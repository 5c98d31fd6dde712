"""The solution process S: runs the generated solution, then answers calls to its functions.

Run as `python -I -S -B sandbox_solution.py CONFIG_JSON` by hlat.eval.sandbox, with two pipe
descriptors: calls arrive on one, answers leave on the other (sandbox_wire frames). Nothing S
does can decide a verdict: the test process T judges the answers it receives, and S cannot reach
T in any other way.

When isolated, this process has been started by `unshare` in new namespaces; it forks the
first process of its PID namespace, which confines itself (sandbox_confine.py) and runs the
solution, and stays behind as its keeper: when the harness closes the keeper's stdin (or dies),
the keeper kills that process, and the kernel then kills everything left in the namespace.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import signal
import sys
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's folder out
import sandbox_wire as wire  # noqa: E402

MIB = 1 << 20


def main() -> None:
    config = json.loads(sys.argv[1])
    calls, answers, setup = config["calls_fd"], config["answers_fd"], config["setup_fd"]
    isolation = config["isolation"]
    if isolation is not None:
        child = os.fork()  # process 1 of the new PID namespace
        if child:
            _keep(child, (calls, answers, setup))
        from sandbox_confine import confine

        confine(
            isolation["root"],
            os.getcwd(),
            isolation["readable"],
            isolation["links"],
            isolation["uid"],
            isolation["scratch_mb"],
        )
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    sys.path += config["site_packages"]  # importable as installed, but no .pth file runs
    _limit(config["limits"])
    os.write(setup, b"ok")  # set up: what fails from here on is the solution's
    os.close(setup)
    _serve(calls, answers)


def _keep(child: int, fds: tuple[int, ...]) -> None:
    """The keeper: hold nothing of the channel, wait for the harness to let go, then kill."""
    for fd in fds:
        os.close(fd)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the harness stops us by closing stdin
    try:
        while os.read(0, 4096):
            pass
    finally:
        os.kill(child, signal.SIGKILL)  # not reaped yet, so the pid cannot have been reused
        os.waitpid(child, 0)
        os._exit(0)


def _limit(limits: dict[str, int]) -> None:
    for limit, value in (
        (resource.RLIMIT_AS, limits["memory_mb"] * MIB),
        (resource.RLIMIT_CPU, limits["cpu_s"]),
        (resource.RLIMIT_FSIZE, limits["file_mb"] * MIB),
        (resource.RLIMIT_NPROC, limits["processes"]),
        (resource.RLIMIT_NOFILE, 256),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))


def _serve(calls: int, answers: int) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    try:
        with open("solution.py", encoding="utf-8") as handle:
            source = handle.read()
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException:  # noqa: BLE001 - reported to the judge, which fails the program
        wire.send(answers, ["load-error", traceback.format_exc(limit=-8)[-4000:]])
        return
    names = {n: v for n, v in namespace.items() if not n.startswith("__") and not hasattr(builtins, n)}
    functions = sorted(n for n, v in names.items() if callable(v))
    modules = {n: v.__name__ for n, v in names.items() if type(v) is type(sys)}
    wire.send(answers, ["ready", functions, modules])
    while True:
        try:
            kind, name, args, kwargs = wire.receive(calls)
        except wire.WireError:
            return  # the judge is done
        try:
            value = namespace[name](*wire.decode(args), **wire.decode(kwargs))
            reply = ["ok", wire.encode(value)]
        except BaseException as err:  # noqa: BLE001 - the judge decides what an error means
            reply = ["raise", type(err).__name__, str(err)[-2000:]]
        try:
            wire.send(answers, reply)
        except wire.WireError as err:
            # an answer over MAX_FRAME is refused before any byte is written: fail this call only
            wire.send(answers, ["raise", "WireError", str(err)])


if __name__ == "__main__":
    main()
