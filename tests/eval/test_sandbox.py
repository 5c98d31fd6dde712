"""The code sandbox: what a generated solution does never makes it pass, and what it must not do
is contained. The hostile programs run together in one parallel batch (module fixture), each
under a 3-second wall clock, 512 MiB and the sandbox's process limit, so a containment failure
shows up as a failed assertion here, not as a hung or killed test run."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from hlat.eval import TASKS, sandbox
from hlat.eval import sandbox_isolation as isolation
from hlat.eval.sandbox import Program, SandboxLimits, UnsafeCodeRefused, run_program, run_programs

from deps import under_ci

LIMITS = SandboxLimits(timeout_s=3.0, memory_mb=512)
ROOMY = SandboxLimits(timeout_s=30.0, memory_mb=512)  # for programs that end by themselves
HANGING = ("infinite_loop", "ignores_sigterm", "fork_bomb")  # held to LIMITS' timeout
SECRET = "planted-" + secrets.token_hex(8)
ADD = "def f(x):\n    return x + 1\n"


def hostile_programs(secret: Path, outside: Path, port: int, victim: int, test_pid: int
                     ) -> dict[str, Program]:
    """name -> a program that must fail; each test of f would pass if its trick worked."""
    forge = ("import os\nfor fd in range(3, 20):\n    try:\n"
             "        os.write(fd, b'\\x00\\x00\\x00\\x0b[\"ok\",[\"b\"]]')\n"
             "    except OSError:\n        pass\nprint('passed')\nos._exit(0)\n")
    return {
        "print_and_exit_early": Program("print('passed')\nimport os\nos._exit(0)\n" + ADD,
                                        "assert f(1) == 2\n"),
        "forged_frames": Program(forge + ADD, "assert f(1) == 2\n"),
        "exit_inside_the_call": Program("import sys\ndef f(x):\n    sys.exit(0)\n",
                                        "assert f(1) == 2\n"),
        # rebinding the server's encoder in its own process only changes what S answers
        "tampered_server": Program("import sys\nsys.modules['sandbox_wire'].encode = "
                                   "lambda value, depth=0: ['i', '2']\n" + "def f(x):\n    return x\n",
                                   "assert f(1) == 2 and f(5) == 6\n"),
        "shadowed_builtin": Program("def len(x):\n    return 3\ndef f(x):\n    return x\n",
                                    "assert len(f([1])) == 3\n"),
        "read_secret": Program(f"def f():\n    return open({str(secret)!r}).read()\n",
                               f"assert f() == {SECRET!r}\n"),
        "write_outside": Program(f"def f():\n    open({str(outside)!r}, 'w').write('x')\n    return 1\n",
                                 "assert f() == 1\n"),
        "network": Program(f"import socket\ndef f():\n    socket.create_connection(('127.0.0.1', {port}), "
                           "timeout=1).close()\n    return 1\n", "assert f() == 1\n"),
        "fork_bomb": Program("import os\nwhile True:\n    try:\n        os.fork()\n"
                             "    except OSError:\n        pass\n", "assert True\n"),
        "memory_bomb": Program("x = []\nwhile True:\n    x.append(bytearray(10**8))\n", "assert True\n"),
        "infinite_loop": Program("while True:\n    pass\n", "assert True\n"),
        "ignores_sigterm": Program("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                   "while True:\n    pass\n", "assert True\n"),
        "child_left_running": Program("import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                                      "    time.sleep(60)\n" + ADD, "assert f(1) == 3\n"),
        "signals_others": Program(
            "import os, signal\n"
            f"for pid, sig in ((os.getppid(), signal.SIGKILL), ({victim}, signal.SIGKILL), "
            f"({test_pid}, signal.SIGUSR1)):\n"
            "    try:\n        os.kill(pid, sig)\n    except OSError:\n        pass\n"
            "def f():\n    return 1\n", "assert f() == 2\n"),
    }


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    """Run every hostile program once, in parallel, and collect what the host saw."""
    if sandbox.isolation_mode() != isolation.NAMESPACES:
        message = ("this machine gives the sandbox no namespaces (`unshare` missing or refused); "
                   "the OS-isolation tests need them")
        if under_ci():
            pytest.fail(message)
        pytest.skip(message)
    tmp = tmp_path_factory.mktemp("host")
    secret, outside = tmp / "secret.txt", tmp / "escaped.txt"
    secret.write_text(SECRET)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    victim = subprocess.Popen(["sleep", "60"])
    received: list[int] = []
    before = signal.signal(signal.SIGUSR1, lambda sig, frame: received.append(sig))
    try:
        programs = hostile_programs(secret, outside, listener.getsockname()[1], victim.pid,
                                    os.getpid())
        # the programs that must be cut off run under the short timeout; the others get room to
        # finish on a loaded machine, so their evidence (MemoryError, OSError...) is always there
        hanging = {name: programs.pop(name) for name in HANGING}
        t0 = time.perf_counter()
        results = dict(zip(hanging, run_programs(list(hanging.values()), LIMITS, workers=4)))
        seconds = time.perf_counter() - t0
        results.update(zip(programs, run_programs(list(programs.values()), ROOMY, workers=4)))
        try:
            connection, _ = listener.accept()
            connection.close()
            connected = True
        except BlockingIOError:
            connected = False
        yield {"results": results, "seconds": seconds, "outside": outside, "connected": connected,
               "victim_alive": victim.poll() is None, "signalled": list(received),
               "survivors": _sandbox_processes()}
    finally:
        signal.signal(signal.SIGUSR1, before)
        victim.kill()
        victim.wait()
        listener.close()


def _sandbox_processes() -> list[str]:
    """Processes still running as a solution's uid, or from sandbox_solution.py."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            uid = int(Path(f"/proc/{pid}/status").read_text().split("\nUid:")[1].split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if isolation.UID_BASE <= uid < isolation.UID_BASE + isolation.UID_SPAN \
                or b"sandbox_solution.py" in cmdline:
            found.append(f"{pid} uid {uid}: {cmdline[:120]!r}")
    return found


def test_correct_programs_pass_even_when_they_print() -> None:
    plain = ("{'a': [1, (2.5, None)], 'b': {1, 2}, 'c': b'\\x00', 'd': complex(1, -2), "
             "'e': float('inf'), 'f': 10**400, 'g': True, 'h': frozenset({'x'})}")
    ok, values, nan, wrong, crash, unplain, unknown = run_programs([
        Program("print('hello')\ndef f(x):\n    print(x)\n    return x + 1\n", "assert f(1) == 2\n"),
        Program(f"def f():\n    return {plain}\n", f"v = f()\nassert v == {plain}\n"
                "assert type(v['a'][1]) is tuple and type(v['g']) is bool\n"),
        Program("def f():\n    return float('nan')\n", "import math\nassert math.isnan(f())\n"),
        Program(ADD, "assert f(1) == 3\n"),
        Program("def f(x):\n    raise ValueError('no')\n", "assert f(1) == 2\n"),
        Program("def f():\n    return object()\n", "assert f() is not None\n"),
        Program("def g():\n    return 1\n", "assert f() == 1\n"),
    ], LIMITS, workers=4)
    assert ok.passed and ok.status == "passed" and ok.detail == ""
    assert values.passed and nan.passed, (values.detail, nan.detail)
    assert not wrong.passed and "AssertionError" in wrong.detail
    assert not crash.passed and "ValueError" in crash.detail
    assert not unplain.passed and "cannot cross" in unplain.detail
    assert not unknown.passed and "NameError" in unknown.detail


def test_mbpp_shaped_tests_see_the_solutions_functions_and_imports() -> None:
    doc = {"test_list": ["assert math.isclose(area(1), 3.141592653589793)",
                         "assert twice(area(1)) > 6"]}  # math: imported by the solution only
    solution = "import math\ndef area(r):\n    return math.pi * r * r\ndef twice(x):\n    return 2 * x\n"
    right, wrong = run_programs([TASKS["mbpp"].program(doc, solution),
                                 TASKS["mbpp"].program(doc, solution.replace("2 * x", "x"))], LIMITS)
    assert right.passed and not wrong.passed, right.detail


@pytest.mark.parametrize("name", [
    "print_and_exit_early", "forged_frames", "exit_inside_the_call", "tampered_server",
    "shadowed_builtin", "read_secret", "write_outside", "network", "fork_bomb", "memory_bomb",
    "infinite_loop", "ignores_sigterm", "child_left_running", "signals_others"])
def test_hostile_program_fails(outcome, name: str) -> None:
    result = outcome["results"][name]
    assert not result.passed and result.status in ("failed", "timeout"), result.detail


def test_hostile_programs_are_contained(outcome) -> None:
    results = outcome["results"]
    assert "No such file" in results["read_secret"].detail  # the host's /tmp is not there
    assert not outcome["outside"].exists()
    assert "Read-only file system" in results["write_outside"].detail \
        or "No such file" in results["write_outside"].detail
    assert not outcome["connected"] and "OSError" in results["network"].detail
    assert "MemoryError" in results["memory_bomb"].detail
    for name in HANGING:
        assert results[name].status == "timeout", name
    # the hanging ones, side by side, are killed at the 3 s timeout
    assert outcome["seconds"] < LIMITS.timeout_s + 10
    assert outcome["survivors"] == [], "processes outlived their sandbox"
    assert outcome["victim_alive"] and outcome["signalled"] == []


def test_writes_inside_the_scratch_directory_work() -> None:
    program = Program("def f():\n    open('scratch.txt', 'w').write('ok')\n"
                      "    import os\n    return open(os.path.join(os.environ['HOME'], 'scratch.txt')).read()\n",
                      "assert f() == 'ok'\n")
    assert run_program(program, LIMITS).passed


def test_without_isolation_code_runs_only_by_explicit_opt_in(monkeypatch) -> None:
    monkeypatch.setattr(sandbox, "isolation_mode", lambda: isolation.NONE)
    monkeypatch.delenv(isolation.UNSAFE_ENV, raising=False)
    program = Program(ADD, "assert f(1) == 2\n")
    with pytest.raises(UnsafeCodeRefused, match="--allow-unsafe-code"):
        run_program(program, LIMITS)
    with pytest.raises(UnsafeCodeRefused, match=isolation.UNSAFE_ENV):
        run_programs([program], LIMITS)
    assert run_program(program, LIMITS, allow_unsafe=True).passed
    monkeypatch.setenv(isolation.UNSAFE_ENV, "1")
    early_exit = Program("import os\nos._exit(0)\n" + ADD, "assert f(1) == 2\n")
    assert [r.passed for r in run_programs([program, early_exit], LIMITS)] == [True, False]


def test_hlat_eval_refuses_code_tasks_before_loading_a_model(monkeypatch, capsys) -> None:
    from hlat.cli import main

    monkeypatch.setattr(sandbox, "isolation_mode", lambda: isolation.NONE)
    monkeypatch.delenv(isolation.UNSAFE_ENV, raising=False)
    assert main(["eval", "--checkpoint", "/nonexistent", "--tasks", "humaneval"]) == 2
    assert "--allow-unsafe-code" in capsys.readouterr().err
