"""The test process T: runs only the dataset's test code and gives the verdict by its exit.

Run as `python -I -S -B sandbox_judge.py SPEC_FILE` by hlat.eval.sandbox. The spec names the
dataset's `prelude` (HumanEval: the prompt, for the helpers its tests use) and `test`, the
channel to the solution process S, and the confinement. T reads it, then confines itself as S
does (sandbox_confine.py): the test code comes from a task file, which is data, and must not reach
the host either; S cannot hand it anything but answers. The solution's functions are bound as
proxies: calling one sends its arguments to S and returns S's answer, decoded as plain data
(sandbox_wire). Exit status 0, reached only after the whole test ran without an exception, is a
pass.
"""

from __future__ import annotations

import builtins
import importlib
import json
import keyword
import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's folder out
import sandbox_confine as confinement  # noqa: E402
import sandbox_wire as wire  # noqa: E402

# standard-library modules a test may use without importing them, when the solution imported
# them at its top level (as MBPP's asserts do with math)
TEST_MODULES = frozenset(
    {
        "math",
        "cmath",
        "re",
        "collections",
        "itertools",
        "functools",
        "heapq",
        "bisect",
        "string",
        "operator",
        "statistics",
        "fractions",
        "decimal",
    }
)


HARNESS_FAILED = 3  # exit status: this process could not set itself up (not a verdict)


class SolutionError(Exception):
    """The solution raised, returned something that cannot cross, or stopped answering."""


class Solution:
    def __init__(self, calls: int, answers: int) -> None:
        self.calls, self.answers = calls, answers

    def ready(self) -> tuple[list[str], dict[str, str]]:
        """The solution's top-level functions and modules, once its code has run."""
        message = self._receive()
        if message[0] == "load-error" and len(message) == 2:
            raise SolutionError(f"the solution failed when it ran:\n{str(message[1])[-2000:]}")
        if message[0] != "ready" or len(message) != 3:
            raise SolutionError(f"unexpected message {message[0][:40]!r} from the solution")
        functions, modules = message[1], message[2]
        if not (
            isinstance(functions, list)
            and all(_bindable(n) for n in functions)
            and isinstance(modules, dict)
            and all(_bindable(n) and isinstance(m, str) for n, m in modules.items())
        ):
            raise SolutionError("the solution announced malformed names")
        return functions, modules

    def proxy(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, args, kwargs)

        call.__name__ = call.__qualname__ = name
        return call

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        wire.send(self.calls, ["call", name, wire.encode(args), wire.encode(kwargs)])
        message = self._receive()
        if message[0] == "ok" and len(message) == 2:
            return wire.decode(message[1])
        if message[0] == "raise" and len(message) == 3:
            kind = getattr(builtins, str(message[1]), None)
            # as the builtin type, so a test may catch it; never StopIteration, which map(), filter()
            # or zip() would take for "no more items", ending a check early as if it held
            plain = isinstance(kind, type) and issubclass(kind, Exception) and kind is not StopIteration
            error = kind if plain else SolutionError
            raise error(f"{name} raised {str(message[1])[:80]}: {str(message[2])[:2000]}")
        raise SolutionError(f"unexpected answer {message[0][:40]!r} from the solution")

    def _receive(self) -> list[Any]:
        try:
            return wire.receive(self.answers)
        except wire.WireError as err:
            raise SolutionError(f"no valid answer from the solution ({err})") from None


def _bindable(name: Any) -> bool:
    """A name the test may see as the solution's: never a builtin the test relies on."""
    return (
        isinstance(name, str)
        and name.isidentifier()
        and not keyword.iskeyword(name)
        and not name.startswith("__")
        and not hasattr(builtins, name)
    )


def main() -> None:
    try:
        with open(sys.argv[1], encoding="utf-8") as handle:
            spec = json.load(handle)  # before confining: the confined root holds no spec
        confinement.enter(spec["isolation"], spec["limits"], (spec["calls_fd"], spec["answers_fd"]))
    except (OSError, ValueError) as err:  # the harness's fault: hlat.eval.sandbox raises SandboxError
        print(f"the test process could not start: {err}", file=sys.stderr)
        sys.exit(HARNESS_FAILED)
    solution = Solution(spec["calls_fd"], spec["answers_fd"])
    functions, modules = solution.ready()
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(spec["prelude"], "prompt.py", "exec"), namespace)
    entry = spec["entry_point"]
    if entry:  # HumanEval: the tests call the solution only through check(candidate)
        if entry not in functions:
            raise SolutionError(f"the solution does not define {entry}")
        namespace[entry] = solution.proxy(entry)
    else:  # MBPP: the asserts call the solution's functions by name
        namespace.update({n: solution.proxy(n) for n in functions})
        namespace.update(
            {n: importlib.import_module(m) for n, m in modules.items() if m in TEST_MODULES and n not in namespace}
        )
    exec(compile(spec["test"], "test.py", "exec"), namespace)


if __name__ == "__main__":
    main()
