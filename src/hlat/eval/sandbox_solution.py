"""The solution process S: runs the generated solution, then answers calls to its functions.

Run as `python -I -S -B sandbox_solution.py CONFIG_JSON` by hlat.eval.sandbox, with two pipe
descriptors: calls arrive on one, answers leave on the other (sandbox_wire frames). Nothing S
does can decide a verdict: the test process T judges the answers it receives, and S cannot reach
T in any other way.

It confines itself first (sandbox_confine.py, as the test process does), and only then runs the
solution.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's folder out
import sandbox_confine as confinement  # noqa: E402
import sandbox_wire as wire  # noqa: E402


def main() -> None:
    config = json.loads(sys.argv[1])
    calls, answers, setup = config["calls_fd"], config["answers_fd"], config["setup_fd"]
    confinement.enter(config["isolation"], config["limits"], (calls, answers, setup))
    sys.path += config["site_packages"]  # importable as installed, but no .pth file runs
    os.write(setup, b"ok")  # set up: what fails from here on is the solution's
    os.close(setup)
    _serve(calls, answers)


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
