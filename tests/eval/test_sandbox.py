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
import sys
import tempfile
import time
from pathlib import Path

import pytest

from deps import under_ci
from hlat.eval import TASKS, sandbox
from hlat.eval import sandbox_isolation as isolation
from hlat.eval import sandbox_wire as wire
from hlat.eval.sandbox import Program, SandboxError, SandboxLimits, UnsafeCodeRefused, run_program, run_programs

LIMITS = SandboxLimits(timeout_s=3.0, memory_mb=512)
ROOMY = SandboxLimits(timeout_s=30.0, memory_mb=512)  # for programs that end by themselves
HANGING = ("infinite_loop", "ignores_sigterm", "fork_bomb")  # held to LIMITS' timeout
SECRET = "planted-" + secrets.token_hex(8)
ADD = "def f(x):\n    return x + 1\n"


def hostile_programs(secret: Path, outside: Path, port: int, victim: int, test_pid: int) -> dict[str, Program]:
    """name -> a program that must fail; each test of f would pass if its trick worked."""
    forge = (
        "import os\nfor fd in range(3, 20):\n    try:\n"
        '        os.write(fd, b\'\\x00\\x00\\x00\\x0b["ok",["b"]]\')\n'
        "    except OSError:\n        pass\nprint('passed')\nos._exit(0)\n"
    )
    return {
        "print_and_exit_early": Program("print('passed')\nimport os\nos._exit(0)\n" + ADD, "assert f(1) == 2\n"),
        "forged_frames": Program(forge + ADD, "assert f(1) == 2\n"),
        "exit_inside_the_call": Program("import sys\ndef f(x):\n    sys.exit(0)\n", "assert f(1) == 2\n"),
        # rebinding the server's encoder in its own process only changes what S answers
        "tampered_server": Program(
            "import sys\nsys.modules['sandbox_wire'].encode = "
            "lambda value, depth=0: ['i', '2']\n" + "def f(x):\n    return x\n",
            "assert f(1) == 2 and f(5) == 6\n",
        ),
        "shadowed_builtin": Program(
            "def len(x):\n    return 3\ndef f(x):\n    return x\n", "assert len(f([1])) == 3\n"
        ),
        "read_secret": Program(f"def f():\n    return open({str(secret)!r}).read()\n", f"assert f() == {SECRET!r}\n"),
        "write_outside": Program(
            f"def f():\n    open({str(outside)!r}, 'w').write('x')\n    return 1\n", "assert f() == 1\n"
        ),
        "network": Program(
            f"import socket\ndef f():\n    socket.create_connection(('127.0.0.1', {port}), "
            "timeout=1).close()\n    return 1\n",
            "assert f() == 1\n",
        ),
        "fork_bomb": Program(
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", "assert True\n"
        ),
        "memory_bomb": Program("x = []\nwhile True:\n    x.append(bytearray(10**8))\n", "assert True\n"),
        "infinite_loop": Program("while True:\n    pass\n", "assert True\n"),
        "ignores_sigterm": Program(
            "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass\n", "assert True\n"
        ),
        "child_left_running": Program(
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n" + ADD, "assert f(1) == 3\n"
        ),
        # the scratch space is a 64 MiB tmpfs: the writer gets ENOSPC, the host's disk nothing
        "fills_the_disk": Program(
            "def f():\n    for i in range(40):\n        with open(f'big{i}.bin', 'wb') as out:\n"
            "            out.write(bytes((16 << 20) - 1))\n    return True\n",
            "assert f()\n",
        ),
        "many_files": Program(
            "def f():\n    for i in range(10**5):\n        open(f'f{i}', 'w').close()\n    return True\n",
            "assert f()\n",
        ),
        # 4 x 400 MiB in processes of 512 MiB each would be 1.6 GiB: no fork (threads share one limit)
        "memory_across_processes": Program(
            "import os\nkids = 0\nfor _ in range(4):\n    if os.fork() == 0:\n"
            "        x = bytearray(400 << 20)\n        os._exit(0)\n    kids += 1\n"
            "def f():\n    return kids\n",
            "assert f() == 4\n",
        ),
        # map(), filter() and zip() take StopIteration from the function for "no more items"
        "stop_iteration": Program(
            "def f(x):\n    raise StopIteration\n",
            "assert all(map(lambda x: f(x) == x + 1, [1, 2]))\nassert not list(filter(lambda x: not f(x), [1]))\n",
        ),
        "signals_others": Program(
            "import os, signal\n"
            f"for pid, sig in ((os.getppid(), signal.SIGKILL), ({victim}, signal.SIGKILL), "
            f"({test_pid}, signal.SIGUSR1)):\n"
            "    try:\n        os.kill(pid, sig)\n    except OSError:\n        pass\n"
            "def f():\n    return 1\n",
            "assert f() == 2\n",
        ),
    }


def _require_namespaces() -> None:
    if sandbox.isolation_mode() != isolation.NAMESPACES:
        message = (
            "this machine gives the sandbox no namespaces (`unshare` missing or refused); "
            "the OS-isolation tests need them"
        )
        if under_ci():
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    """Run every hostile program once, in parallel, and collect what the host saw."""
    _require_namespaces()
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
        programs = hostile_programs(secret, outside, listener.getsockname()[1], victim.pid, os.getpid())
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
        yield {
            "results": results,
            "seconds": seconds,
            "outside": outside,
            "connected": connected,
            "victim_alive": victim.poll() is None,
            "signalled": list(received),
            "survivors": _sandbox_processes(),
            "scratch_left": list(Path(tempfile.gettempdir()).glob("hlat-sandbox-*/scratch/big*")),
        }
    finally:
        signal.signal(signal.SIGUSR1, before)
        victim.kill()
        victim.wait()
        listener.close()


def _sandbox_processes() -> list[str]:
    """Processes still running as a sandbox uid, or from sandbox_solution.py or sandbox_judge.py."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            uid = int(Path(f"/proc/{pid}/status").read_text().split("\nUid:")[1].split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if isolation.UID_BASE <= uid < isolation.UID_BASE + isolation.UID_SPAN or any(
            script in cmdline for script in (b"sandbox_solution.py", b"sandbox_judge.py")
        ):
            found.append(f"{pid} uid {uid}: {cmdline[:120]!r}")
    return found


def test_correct_programs_pass_even_when_they_print() -> None:
    plain = (
        "{'a': [1, (2.5, None)], 'b': {1, 2}, 'c': b'\\x00', 'd': complex(1, -2), "
        "'e': float('inf'), 'f': 10**400, 'g': True, 'h': frozenset({'x'})}"
    )
    ok, values, nan, wrong, crash, unplain, unknown = run_programs(
        [
            Program("print('hello')\ndef f(x):\n    print(x)\n    return x + 1\n", "assert f(1) == 2\n"),
            Program(
                f"def f():\n    return {plain}\n",
                f"v = f()\nassert v == {plain}\nassert type(v['a'][1]) is tuple and type(v['g']) is bool\n",
            ),
            Program("def f():\n    return float('nan')\n", "import math\nassert math.isnan(f())\n"),
            Program(ADD, "assert f(1) == 3\n"),
            Program("def f(x):\n    raise ValueError('no')\n", "assert f(1) == 2\n"),
            Program("def f():\n    return object()\n", "assert f() is not None\n"),
            Program("def g():\n    return 1\n", "assert f() == 1\n"),
        ],
        LIMITS,
        workers=4,
    )
    assert ok.passed and ok.status == "passed" and ok.detail == ""
    assert values.passed and nan.passed, (values.detail, nan.detail)
    assert not wrong.passed and "AssertionError" in wrong.detail
    assert not crash.passed and "ValueError" in crash.detail
    assert not unplain.passed and "cannot cross" in unplain.detail
    assert not unknown.passed and "NameError" in unknown.detail


def test_mbpp_shaped_tests_see_the_solutions_functions_and_imports() -> None:
    doc = {
        "test_list": ["assert math.isclose(area(1), 3.141592653589793)", "assert twice(area(1)) > 6"]
    }  # math: imported by the solution only
    solution = "import math\ndef area(r):\n    return math.pi * r * r\ndef twice(x):\n    return 2 * x\n"
    right, wrong = run_programs(
        [TASKS["mbpp"].program(doc, solution), TASKS["mbpp"].program(doc, solution.replace("2 * x", "x"))], LIMITS
    )
    assert right.passed and not wrong.passed, right.detail


@pytest.mark.parametrize(
    "name",
    [
        "print_and_exit_early",
        "forged_frames",
        "exit_inside_the_call",
        "tampered_server",
        "shadowed_builtin",
        "read_secret",
        "write_outside",
        "network",
        "fork_bomb",
        "memory_bomb",
        "infinite_loop",
        "ignores_sigterm",
        "child_left_running",
        "fills_the_disk",
        "many_files",
        "memory_across_processes",
        "stop_iteration",
        "signals_others",
    ],
)
def test_hostile_program_fails(outcome, name: str) -> None:
    result = outcome["results"][name]
    assert not result.passed and result.status in ("failed", "timeout"), result.detail


def test_hostile_programs_are_contained(outcome) -> None:
    results = outcome["results"]
    assert "No such file" in results["read_secret"].detail  # the host's /tmp is not there
    assert not outcome["outside"].exists()
    assert (
        "Read-only file system" in results["write_outside"].detail or "No such file" in results["write_outside"].detail
    )
    assert not outcome["connected"] and "OSError" in results["network"].detail
    assert "MemoryError" in results["memory_bomb"].detail
    assert "No space left on device" in results["fills_the_disk"].detail
    assert "No space left on device" in results["many_files"].detail
    assert "BlockingIOError" in results["memory_across_processes"].detail  # EAGAIN: over RLIMIT_NPROC
    assert "SolutionError: f raised StopIteration" in results["stop_iteration"].detail
    assert outcome["scratch_left"] == [], "the solution's files reached the host"
    for name in HANGING:
        assert results[name].status == "timeout", name
    # the hanging ones, side by side, are killed at the 3 s timeout
    assert outcome["seconds"] < LIMITS.timeout_s + 10
    assert outcome["survivors"] == [], "processes outlived their sandbox"
    assert outcome["victim_alive"] and outcome["signalled"] == []


def test_writes_inside_the_scratch_directory_work() -> None:
    program = Program(
        "def f():\n    open('scratch.txt', 'w').write('ok')\n"
        "    import os\n    return open(os.path.join(os.environ['HOME'], 'scratch.txt')).read()\n",
        "assert f() == 'ok'\n",
    )
    assert run_program(program, LIMITS).passed


ALLOWED_ENV = ["HOME", "LANG", "OMP_NUM_THREADS", "PATH", "PYTHONHASHSEED", "TMPDIR"]
TOKEN_VAR = "HLAT_TEST_API_TOKEN"


def confinement_program(token: str, read_proc: bool) -> Program:
    """One solution process that tries to read a secret from its environment, raise and exceed
    its file-size and open-file limits, see a .pth file's effects and keep or mutate the test's
    arguments; the test passes only if every attempt is contained."""
    solution = (
        "import os, resource, sys\n"
        "def environment():\n"
        "    return dict(os.environ)\n"
        "def proc_environments():\n"  # the keeper's and the harness's environment, through /proc
        "    found = []\n"
        "    for pid in ('self', '1', str(os.getppid())):\n"
        "        try:\n"
        "            found.append(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "        except OSError:\n"
        "            pass\n"
        "    return found\n"
        "def raise_limits():\n"
        "    raised = []\n"
        "    for name, value in (('RLIMIT_FSIZE', 1 << 34), ('RLIMIT_NOFILE', 4096)):\n"
        "        try:\n"
        "            resource.setrlimit(getattr(resource, name), (value, value))\n"
        "            raised.append(name)\n"
        "        except (OSError, ValueError):\n"
        "            pass\n"
        "    return raised\n"
        "def write_file(size):\n"
        "    error = 0\n"
        "    try:\n"
        "        with open('big.bin', 'wb') as handle:\n"
        "            handle.write(bytes(size))\n"
        "    except OSError as err:\n"
        "        error = err.errno\n"
        "    return error, os.path.getsize('big.bin')\n"
        "def open_files(n):\n"
        "    fds, error = [], 0\n"
        "    try:\n"
        "        for _ in range(n):\n"
        "            fds.append(os.open(os.devnull, os.O_RDONLY))\n"
        "    except OSError as err:\n"
        "        error = err.errno\n"
        "    for fd in fds:\n"
        "        os.close(fd)\n"
        "    return error, len(fds), max(fds)\n"
        "def pth_effects():\n"
        "    import pth_neighbour\n"
        "    return (pth_neighbour.VALUE, os.environ.get('PTH_RAN'),\n"
        "            [p for p in sys.path if p.endswith('pth-extra')])\n"
        "KEPT = []\n"
        "def mutate(xs, table):\n"
        "    xs.append(99)\n"
        "    xs[0] = -1\n"
        "    table['k'].append(4)\n"
        "    table['new'] = xs\n"
        "    KEPT.append(xs)\n"
        "    return xs\n"
        "def mutate_kept():\n"
        "    for kept in KEPT:\n"
        "        kept.clear()\n"
        "    return KEPT\n"
    )
    seen = "repr(env) + repr(proc_environments())" if read_proc else "repr(env)"
    test = (
        "import errno\n"
        "env = environment()\n"
        f"assert sorted(env) == {ALLOWED_ENV!r}, sorted(env)\n"
        f"assert {token!r} not in {seen}, 'the secret crossed'\n"
        "assert raise_limits() == []\n"
        # a 17 MiB write stops at 16 MiB with EFBIG (Python ignores SIGXFSZ)
        f"written = write_file({17 << 20})\n"
        f"assert written == (errno.EFBIG, {16 << 20}), written\n"
        "error, opened, highest = open_files(300)\n"
        "assert error == errno.EMFILE and highest == 255, (error, opened, highest)\n"
        "assert pth_effects() == (7, None, [])\n"
        "xs, table = [1, 2], {'k': [3]}\n"
        "returned = mutate(xs, table=table)\n"
        "assert mutate_kept() == [[]]\n"
        "assert xs == [1, 2] and table == {'k': [3]}, (xs, table)\n"
        "assert returned == [-1, 2, 99], returned\n"
    )
    return Program(solution, test)


def _plant_virtual_environment(tmp: Path, marker: Path) -> tuple[Path, Path]:
    """(interpreter, site-packages) of a virtual environment whose site-packages holds a module
    and a .pth file that, if the interpreter processed it at startup, would set an environment
    variable, write `marker` on the host and add a directory to sys.path."""
    venv = tmp / "venv"
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "pth-extra").mkdir(parents=True)
    (venv / "bin").mkdir()
    real = os.path.realpath(sys.executable)
    (venv / "pyvenv.cfg").write_text(f"home = {os.path.dirname(real)}\ninclude-system-site-packages = false\n")
    (venv / "bin" / "python").symlink_to(real)
    (site / "pth_neighbour.py").write_text("VALUE = 7\n")
    (site / "zz_hook.pth").write_text(
        f"import os; os.environ['PTH_RAN'] = '1'; open({str(marker)!r}, 'w').close()\npth-extra\n"
    )
    for path in (venv, *venv.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)  # readable by the solution's own uid
    return venv / "bin" / "python", site


@pytest.mark.parametrize("mode", [isolation.NAMESPACES, isolation.NONE])
def test_solution_sees_no_secret_no_pth_hook_capped_files_and_copies_of_arguments(
    monkeypatch, tmp_path, mode: str
) -> None:
    if mode == isolation.NAMESPACES:
        _require_namespaces()
    else:
        monkeypatch.setattr(sandbox, "isolation_mode", lambda: isolation.NONE)
    token = "token-" + secrets.token_hex(16)
    monkeypatch.setenv(TOKEN_VAR, token)  # e.g. an API token of the user running hlat
    # both processes start from an interpreter whose own site-packages holds a .pth file
    marker = tmp_path / "pth-ran"
    interpreter, site = _plant_virtual_environment(tmp_path, marker)
    (readable, links), packages = isolation.readable_paths(), isolation.site_packages()
    for_test = isolation.readable_paths(packages=False)
    monkeypatch.setattr(sys, "executable", str(interpreter))
    monkeypatch.setattr(isolation, "site_packages", lambda: packages + [str(site)])
    monkeypatch.setattr(
        isolation,
        "readable_paths",
        lambda packages=True: (readable + [str(interpreter.parent.parent)], links) if packages else for_test,
    )
    # without namespaces it may read /proc/<parent>/environ: it has the user's rights, as documented
    program = confinement_program(token, read_proc=mode == isolation.NAMESPACES)
    result = run_program(program, ROOMY, allow_unsafe=True)
    assert result.passed, result.detail
    assert not marker.exists(), "a .pth file ran"


def test_values_over_the_wire_limits_fail_only_that_call() -> None:
    """A hostile solution answers with values over the limits, or forges frames on the answer
    pipe: each such call fails with an error naming the limit (no RecursionError, MemoryError or
    hang in the test process). A value over the limits fails only its call: the next one works."""
    deep, big = f"nested deeper than {wire.MAX_DEPTH}", f"over the {wire.MAX_FRAME}-byte limit"
    expect = (
        "def expect_failure(call, limit):\n"
        "    try:\n        call()\n"
        "    except Exception as err:\n"
        "        assert type(err).__name__ in ('SolutionError', 'WireError'), repr(err)\n"
        "        assert limit in str(err), repr(err)\n"
        "    else:\n        raise AssertionError('the value crossed')\n"
    )
    forge = (
        "import json, os, sys\n"
        "ANSWERS = json.loads(sys.argv[1])['answers_fd']\n"
        "def answer(prefix, body=b''):\n"
        "    os.write(ANSWERS, prefix + body)\n"
        "    return 1\n"
        "def nested(levels):\n"
        "    body = b'[\"ok\",' + b'[\"l\",[' * levels + b'[\"n\"]' + b']]' * levels + b']'\n"
        "    return answer(len(body).to_bytes(4, 'big'), body)\n"
    )

    def forged(call: str, limit: str) -> Program:
        return Program(forge, expect + f"expect_failure(lambda: {call}, {limit!r})\n")

    programs = {
        "returned": Program(
            "def deep():\n    x = []\n    for _ in range(10**5):\n        x = [x]\n    return x\n"
            "def huge():\n    return 'x' * (100 << 20)\n" + ADD,
            expect + f"expect_failure(deep, {deep!r})\nexpect_failure(huge, {big!r})\nassert f(1) == 2\n",
        ),
        # a length prefix of 4 GiB - 1, then 10**5 and 100 levels of valid nesting in a frame
        "forged_length": forged("answer(b'\\xff' * 4)", big),
        "forged_deep_frame": forged("nested(10**5)", deep),
        "forged_nested_value": forged("nested(100)", deep),
    }
    results = run_programs(list(programs.values()), ROOMY, workers=4)
    failures = {name: r.detail for name, r in zip(programs, results) if not r.passed}
    assert not failures, "\n\n".join(f"{name}: ...{text[-700:]}" for name, text in failures.items())


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


def test_solution_exceptions_reach_the_test_as_their_type() -> None:
    """A test may catch the solution's ValueError as such; only StopIteration arrives as
    SolutionError (test_hostile_program_fails: stop_iteration)."""
    program = Program(
        "def f(x):\n    raise ValueError('no')\n",
        "try:\n    f(1)\nexcept ValueError as err:\n    assert 'no' in str(err)\nelse:\n    raise AssertionError\n",
    )
    assert run_program(program, ROOMY).passed


def test_without_namespaces_the_scratch_quota_is_polled(monkeypatch) -> None:
    """No tmpfs there: the harness measures the scratch directory and stops a program past it."""
    monkeypatch.setattr(sandbox, "isolation_mode", lambda: isolation.NONE)
    writer = Program(
        "import time\ndef f():\n    for i in range(64):\n        with open(f'big{i}.bin', 'wb') as out:\n"
        "            out.write(bytes(1 << 20))\n        time.sleep(0.05)\n    return True\n",
        "assert f()\n",
    )
    result = run_program(writer, SandboxLimits(timeout_s=30.0, memory_mb=512, scratch_mb=4), allow_unsafe=True)
    assert result.status == "failed" and "wrote more than 4 MiB of files" in result.detail, result


@pytest.mark.parametrize("broken", ["test process", "solution process", "confined test process"])
def test_a_broken_harness_raises_instead_of_failing_programs(monkeypatch, broken: str) -> None:
    program = Program(ADD, "assert f(1) == 2\n")
    if broken == "test process":  # e.g. a file it cannot read
        monkeypatch.setattr(sandbox, "JUDGE", "/nonexistent/sandbox_judge.py")
        mode = isolation.NONE
    else:  # a mount that fails while the solution or the test process confines itself
        _require_namespaces()
        original = isolation.readable_paths

        def broken_paths(packages: bool = True) -> tuple[list[str], dict[str, str]]:
            readable, links = original(packages)
            if packages == (broken == "solution process"):  # packages: the solution's paths
                readable = readable + ["/nonexistent-hlat"]
            return readable, links

        monkeypatch.setattr(isolation, "readable_paths", broken_paths)
        mode = isolation.NAMESPACES
    with pytest.raises(SandboxError, match=f"the {broken.removeprefix('confined ')}"):
        sandbox._run(program, ROOMY, mode)
