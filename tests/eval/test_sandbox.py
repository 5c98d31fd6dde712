"""The code sandbox stops what generated code must not do, and scores it as a failure."""

from __future__ import annotations

import time

import pytest

from hlat.eval.sandbox import SandboxLimits, run_program, run_programs

LIMITS = SandboxLimits(timeout_s=2.0, memory_mb=512)


def test_correct_and_wrong_programs() -> None:
    ok, wrong, early_exit = run_programs(
        ["def f(x):\n    return x + 1\nassert f(1) == 2\n", "assert 1 == 2\n",
         "import os\nos._exit(0)\nassert False\n"], LIMITS, workers=3)
    assert ok.passed and ok.status == "passed"
    assert not wrong.passed and "AssertionError" in wrong.detail
    assert not early_exit.passed  # exiting before the tests ran is not a pass


def test_infinite_loop_is_killed_at_the_timeout() -> None:
    t0 = time.perf_counter()
    result = run_program("while True:\n    pass\n", LIMITS)
    assert result.status == "timeout" and not result.passed
    assert time.perf_counter() - t0 < LIMITS.timeout_s + 3


def test_unbounded_allocation_fails_without_harming_the_harness() -> None:
    result = run_program("x = []\nwhile True:\n    x.append(bytearray(10**8))\n", LIMITS)
    assert not result.passed and "MemoryError" in result.detail
    assert run_program("assert sum(range(10)) == 45\n", LIMITS).passed  # the next one still runs


@pytest.mark.parametrize("code", [
    "import socket\nsocket.create_connection(('127.0.0.1', 9))\n",
    "import urllib.request\nurllib.request.urlopen('http://example.com')\n",
])
def test_network_is_refused(code: str) -> None:
    result = run_program(code, LIMITS)
    assert not result.passed and "sandbox: socket" in result.detail


def test_writes_outside_the_temp_dir_are_refused(tmp_path) -> None:
    target = tmp_path / "escaped.txt"
    for code in (f"open({str(target)!r}, 'w').write('x')\n",
                 f"import os\nos.close(os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY))\n",
                 f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')\n"):
        result = run_program(code, LIMITS)
        assert not result.passed and "outside the sandbox directory" in result.detail
    assert not target.exists()
    inside = run_program("open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'\n", LIMITS)
    assert inside.passed


def test_processes_and_ctypes_are_refused() -> None:
    for code in ("import subprocess\nsubprocess.run(['true'])\n", "import os\nos.system('true')\n",
                 "import ctypes\n"):
        result = run_program(code, LIMITS)
        assert not result.passed and "sandbox:" in result.detail
