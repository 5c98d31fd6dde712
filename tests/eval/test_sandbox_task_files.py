"""A task file is data: its test code runs confined like the solution, never on the host.

The rows below are what a hostile HumanEval or MBPP file a user downloaded could hold. They run
through the path `hlat eval` takes (a local task file, evaluate_task, run_programs) with correct
completions, so each program would pass if its trick reached the host."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from hlat.eval import TASKS, EvalOptions, SandboxLimits, evaluate_task, run_programs
from test_sandbox import SECRET, _require_namespaces, _sandbox_processes
from test_tasks import FixedAnswers

LIMITS = SandboxLimits(timeout_s=30.0, memory_mb=512)  # every program ends by itself
PROMPT, COMPLETION = 'def f(x):\n    """x + 1"""\n', "    return x + 1\n"
CHECK = "    assert candidate(1) == 2\n"


def hostile_rows(host: Path, port: int) -> dict[str, dict[str, str]]:
    """name -> a HumanEval row whose test (or prompt, which the test process runs too) passes
    only if it reached the host; "confined" passes only where it did not."""

    def row(test: str, prompt: str = PROMPT) -> dict[str, str]:
        return {"task_id": "x", "prompt": prompt, "entry_point": "f", "canonical_solution": COMPLETION, "test": test}

    system, prompt_file = f"echo pwned > {host / 'system.txt'}", str(host / "prompt.txt")
    return {
        "os_system": row(f"import os\ndef check(candidate):\n    assert os.system({system!r}) == 0\n{CHECK}"),
        "write_outside": row(
            f"def check(candidate):\n    open({str(host / 'written.txt')!r}, 'w').write('x')\n{CHECK}"
        ),
        "read_secret": row(
            "import sys\ndef check(candidate):\n"
            f"    stolen = open({str(host / 'secret.txt')!r}).read()\n"
            f"    print(stolen, file=sys.stderr)\n    assert stolen.startswith('planted-')\n{CHECK}"
        ),
        "network": row(
            "import socket\ndef check(candidate):\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n{CHECK}"
        ),
        # the prompt runs in the solution process too, where the write fails: it must not stop there
        "prompt_writes": row(
            f"import os\ndef check(candidate):\n    assert os.path.exists({prompt_file!r})\n{CHECK}",
            prompt=f"try:\n    open({prompt_file!r}, 'w').write('x')\nexcept OSError:\n    pass\n" + PROMPT,
        ),
        "confined": row(
            "import os\ndef check(candidate):\n"
            f"    assert not os.path.exists({str(host)!r}) and not os.path.exists('/etc')\n"
            f"    assert os.getcwd() == '/sandbox' and os.getuid() != 0\n{CHECK}"
        ),
    }


@pytest.fixture
def host(tmp_path) -> Path:
    folder = tmp_path / "host"
    folder.mkdir()
    (folder / "secret.txt").write_text(SECRET)
    return folder


def test_a_task_files_test_code_cannot_reach_the_host(lm, tmp_path, host) -> None:
    _require_namespaces()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    try:
        rows = hostile_rows(host, listener.getsockname()[1])
        (tmp_path / "data" / "humaneval").mkdir(parents=True)
        (tmp_path / "data" / "humaneval" / "test.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows.values())
        )
        result = evaluate_task(
            FixedAnswers(lm, [COMPLETION] * len(rows)),
            TASKS["humaneval"],
            EvalOptions(data_dir=tmp_path / "data", sandbox=LIMITS, workers=2),
        )
        try:
            connection, _ = listener.accept()
            connection.close()
            connected = True
        except BlockingIOError:
            connected = False
    finally:
        listener.close()
    outcome = {name: (s["status"][0], s["errors"][0]) for name, s in zip(rows, result.samples)}
    assert sorted(p.name for p in host.iterdir()) == ["secret.txt"], "the test code wrote on the host"
    assert not connected, "the test code reached the host's network"
    assert SECRET not in str(result.samples) and "No such file" in outcome["read_secret"][1]
    assert outcome.pop("confined")[0] == "passed", "the test code ran outside the sandbox"
    assert all(status == "failed" for status, _ in outcome.values()), outcome
    assert _sandbox_processes() == []


def test_mbpp_asserts_cannot_run_commands_on_the_host(host) -> None:
    _require_namespaces()
    marker = host / "system.txt"
    doc = {"test_list": ["import os", f"assert os.system('echo pwned > {marker}') == 0", "assert f(1) == 2"]}
    (result,) = run_programs([TASKS["mbpp"].program(doc, PROMPT + COMPLETION)], LIMITS)
    assert result.status == "failed" and "AssertionError" in result.detail, result
    assert not marker.exists()
