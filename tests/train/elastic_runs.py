"""Scenario functions (tests/runs.py) for elastic data parallelism (hlat.train.elastic), and the
helpers of its tests: replica groups of one process each, on gloo on one machine.

`elastic` trains one group in the scenario's process, at a lighthouse of its own: the
checkpoints an elastic run writes, for the tests that resume them in other layouts
(tests/train/test_elastic_faults.py). `killed_restarted`, `hung_group` and `lighthouse_death`
start groups as processes of their own (`hlat train`, as a user would) from the scenario
process, with the lighthouse there: most of their time is waiting (holds, heartbeats,
timeouts), spent beside the single-process tests. Each leaves its runs, logs and the process
ids the tests assert on (tests/train/test_elastic.py, tests/train/test_elastic_faults.py) in
its directory; what must hold while it runs (a group killed, a refusal) is asserted there.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from subprocess import STDOUT
from unittest import mock

from torchft.coordination import LighthouseServer

from hlat.checkpoint.manager import CheckpointManager

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
from layout_runs import train  # noqa: E402
from runs import ScenarioContext, outside, tiny_args  # noqa: E402

GROUPS, STEPS, KILL = 3, 8, 3  # group 1 dies before step KILL and is restarted after step KILL + 1
ELASTIC = [
    "--train.global_batch", "6", "--train.micro_batch", "1", "--train.steps", str(STEPS),
    "--parallel.compile", "false", "--elastic.enabled", "true", "--elastic.max_groups", str(GROUPS),
    "--elastic.timeout_s", "60", "--elastic.secret_env", "HLAT_TEST_RUN_SECRET",
]  # fmt: skip
# the run secret of every group these runs start (each process that imports this module draws its own)
SECRET = {"HLAT_TEST_RUN_SECRET": secrets.token_hex(32)}
DEADLINE_S = 300  # a bound for hangs, not a budget
HANG_STEPS, HANG = 6, 3  # hung_group: group 1 of GROUPS freezes inside step HANG
HANG_TIMEOUT_S = 4  # elastic.timeout_s of the hang run
HANG_JOIN_MS = 1000  # the lighthouse's join timeout there
DEATH_STEPS = 6  # lighthouse_death: group 0 of 2, the lighthouse killed after step 3


def lighthouse(min_groups: int):
    return LighthouseServer(bind="[::]:0", min_replicas=min_groups, join_timeout_ms=10_000, heartbeat_timeout_ms=1500)


def start_group(
    corpus: Path, run: Path, server, group: int, min_groups: int, *extra: str, elastic: list[str] = ELASTIC, **env: str
):
    args = tiny_args(corpus, run / f"group{group}", *elastic, *extra)
    args += ["--elastic.lighthouse", server.address(), "--elastic.group", str(group)]
    args += ["--elastic.min_groups", str(min_groups)]
    log = open(run / f"group{group}.{len(list(run.glob(f'group{group}.*.log')))}.log", "w")
    environ = {**os.environ, "OMP_NUM_THREADS": "1", **SECRET, **env}
    return subprocess.Popen([sys.executable, "-m", "hlat", "train", *args], stdout=log, stderr=log, env=environ)


def records(run: Path) -> list[dict]:
    return [
        json.loads(line) for f in sorted(run.glob("group[012]/tokens.*.jsonl")) for line in f.read_text().splitlines()
    ]


def wait(proc: subprocess.Popen, run: Path) -> None:
    code = proc.wait(timeout=DEADLINE_S)
    assert code == 0, "\n".join(f.read_text()[-3000:] for f in sorted(run.glob("*.log")))


@contextlib.contextmanager
def ending(procs: list[subprocess.Popen]):
    """Whatever happens, no process of the list outlives the scenario."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def elastic(
    ctx: ScenarioContext,
    steps: int,
    shares: int,
    extra: list[str] = (),
    resume: str = "auto",
    start_from: str | None = None,
) -> None:
    """`layout_runs.train` as elastic group 0 of at most `shares` (it holds every data share)."""
    server = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=1000, heartbeat_timeout_ms=1500)
    group = ["--elastic.enabled", "true", "--elastic.lighthouse", server.address(), "--elastic.group", "0"]
    group += ["--elastic.trusted_network", "true"]  # one group alone (the secret: SECRET, above)
    try:
        with mock.patch.dict(os.environ):
            for name in ("MASTER_ADDR", "MASTER_PORT"):  # the group's own store, not the shared launch's
                os.environ.pop(name, None)
            train(ctx, steps, [*group, "--elastic.max_groups", str(shares), *extra], resume, start_from)
    finally:
        server.shutdown()


def killed_restarted(ctx: ScenarioContext) -> None:
    """Three groups under ctx.out/faulty: group 1 killed before step KILL, an intruder whose data
    differs refused, group 1 restarted; beside them, under ctx.out/straight, one group
    holding all three shares uninterrupted (the data order does not depend on how many groups are
    present), at a lighthouse of its own. pids.json: the groups' first processes and the restart's."""
    straight, faulty = ctx.out / "straight", ctx.out / "faulty"
    straight.mkdir()
    faulty.mkdir()
    started: list[subprocess.Popen] = []
    alone, shared = lighthouse(1), lighthouse(2)
    with outside(ctx), ending(started), contextlib.ExitStack() as servers:
        servers.callback(alone.shutdown)
        servers.callback(shared.shutdown)
        reference = start_group(ctx.corpus, straight, alone, 0, 1)
        # all three at step 1; three again at KILL + 2 (the intruder is the third) and at KILL + 3 (group 1)
        hold = {"HLAT_ELASTIC_HOLD": f"1:{GROUPS},{KILL + 2}:{GROUPS},{KILL + 3}:{GROUPS}"}
        fault = {"HLAT_FAULT": f"step:{KILL}:0", "HLAT_FAULT_MARKER": str(ctx.out / "killed")}
        procs = [start_group(ctx.corpus, faulty, shared, g, 2, **hold, **(fault if g == 1 else {})) for g in range(3)]
        started += [reference, *procs]
        assert procs[1].wait(timeout=DEADLINE_S) == -9, "group 1 was not killed"
        deadline = time.monotonic() + DEADLINE_S
        while not any(r["step"] == KILL + 1 for r in records(faulty)):  # the survivors trained two steps without it
            assert time.monotonic() < deadline and all(p.poll() is None for p in (procs[0], procs[2])), (
                "survivors stopped"
            )
            time.sleep(0.2)
        # while the survivors hold before step KILL + 2, a group whose data differs (one file of a copy of
        # the corpus, elsewhere: only the content is fingerprinted) arrives: it is refused when it would
        # heal from them (the step it joined is retried); then group 1 comes back
        other = shutil.copytree(ctx.corpus, ctx.out / "other-corpus")
        first = sorted(other.iterdir())[0]
        first.write_text(first.read_text() + "\n# another line\n")
        intruder = start_group(other, faulty, shared, 3, 2)
        started.append(intruder)
        assert intruder.wait(timeout=DEADLINE_S) == 2
        refusal = (faulty / "group3.0.log").read_text().strip().splitlines()[-1]
        assert refusal.startswith("hlat train: elastic group 3 refused: its configuration or data"), refusal
        restarted = start_group(ctx.corpus, faulty, shared, 1, 2, **hold)
        started.append(restarted)
        for proc in (procs[0], procs[2], restarted, reference):
            wait(proc, faulty if proc is not reference else straight)
    (ctx.out / "pids.json").write_text(json.dumps({"groups": [p.pid for p in procs], "restarted": restarted.pid}))


def deterministic(ctx: ScenarioContext, steps: int, kill: int, extra: list[str]) -> None:
    """Three groups of one process under train.deterministic (`extra`: its flags) in ctx.out: group
    1 killed before step `kill`, groups 0 and 2 alone for two steps, group 1 restarted (it heals
    from a survivor) and all three to `steps`. The global batch is tiny_args' 4 micro-batches:
    1, 1 and 2 for three groups present, 2 and 2 for two."""
    server = lighthouse(1)
    elastic = [
        "--train.steps", str(steps), "--parallel.compile", "false", "--elastic.enabled", "true",
        "--elastic.max_groups", "3", "--elastic.timeout_s", "60", "--elastic.secret_env", "HLAT_TEST_RUN_SECRET",
        *extra,
    ]  # fmt: skip
    hold = {"HLAT_ELASTIC_HOLD": f"1:3,{kill + 2}:3"}  # all at step 1, and again once group 1 is back
    fault = {"HLAT_FAULT": f"step:{kill}:0", "HLAT_FAULT_MARKER": str(ctx.out / "killed")}
    started: list[subprocess.Popen] = []
    with outside(ctx), ending(started), contextlib.ExitStack() as servers:
        servers.callback(server.shutdown)
        procs = [
            start_group(ctx.corpus, ctx.out, server, g, 1, elastic=elastic, **hold, **(fault if g == 1 else {}))
            for g in range(3)
        ]
        started += procs
        assert procs[1].wait(timeout=DEADLINE_S) == -9, "group 1 was not killed"
        deadline = time.monotonic() + DEADLINE_S
        while not any(r["step"] == kill + 1 for r in records(ctx.out)):  # the others trained two steps without it
            assert time.monotonic() < deadline and procs[0].poll() is None and procs[2].poll() is None, "stopped"
            time.sleep(0.2)
        restarted = start_group(ctx.corpus, ctx.out, server, 1, 1, elastic=elastic, **hold)
        started.append(restarted)
        for proc in (procs[0], procs[2], restarted):
            wait(proc, ctx.out)


def hung_group(ctx: ScenarioContext) -> None:
    """Three groups under ctx.out/faulty, group 1 frozen inside step HANG (alive, silent) and left
    running until the others have finished; beside them, under ctx.out/straight, one group holding
    all three shares uninterrupted. pids.json: the groups' processes."""
    straight, faulty = ctx.out / "straight", ctx.out / "faulty"
    straight.mkdir()
    faulty.mkdir()
    extra = (
        "--elastic.max_groups", str(GROUPS), "--elastic.timeout_s", str(HANG_TIMEOUT_S),
        "--train.steps", str(HANG_STEPS),
    )  # fmt: skip
    alone, shared = (
        LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=HANG_JOIN_MS, heartbeat_timeout_ms=1500)
        for _ in range(2)
    )
    started: list[subprocess.Popen] = []
    try:
        with outside(ctx), ending(started):
            reference = start_group(ctx.corpus, straight, alone, 0, 1, *extra)
            hold = {"HLAT_ELASTIC_HOLD": f"1:{GROUPS}"}  # all three train from step 1
            fault = {"HLAT_FAULT": f"hang-compute:{HANG}:0", "HLAT_FAULT_MARKER": str(ctx.out / "froze")}
            procs = [
                start_group(ctx.corpus, faulty, shared, g, 1, *extra, **hold, **(fault if g == 1 else {}))
                for g in range(GROUPS)
            ]
            started += [reference, *procs]
            wait(procs[0], faulty)
            wait(procs[2], faulty)
            wait(reference, straight)
            assert procs[1].poll() is None, "the hung group exited"
    finally:
        shared.shutdown()
        alone.shutdown()
    (ctx.out / "pids.json").write_text(json.dumps({"groups": [p.pid for p in procs]}))


def _lighthouse_process(port: int, log: Path) -> subprocess.Popen:
    """`hlat lighthouse` on `port`, once it listens."""
    args = ["--port", str(port), "--heartbeat-timeout-ms", "1500"]
    proc = subprocess.Popen([sys.executable, "-m", "hlat", "lighthouse", *args], stdout=log.open("w"), stderr=STDOUT)
    deadline = time.monotonic() + DEADLINE_S
    while "listening" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    return proc


def lighthouse_death(ctx: ScenarioContext) -> None:
    """`hlat lighthouse` on a free port, one group of two (it waits before step 4 for the other,
    which never comes) under ctx.out/group0, checkpoints every 2 steps; the lighthouse killed once
    step 3 is trained. stopped.json: the port, the group's exit code and its latest checkpoint then
    (its output: group.0.log; its token records: before.jsonl). Then the lighthouse restarted on
    the same port and the same command run to the end (resumed.json: its exit code and output, and
    the first run's process id)."""
    with socket.socket() as s:  # a free port
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    out, run = ctx.out, ctx.out / "group0"
    args = tiny_args(ctx.corpus, run, *ELASTIC, "--elastic.max_groups", "2", "--elastic.timeout_s", "3")
    args += ["--train.steps", str(DEATH_STEPS)]
    args += ["--elastic.lighthouse", f"http://localhost:{port}", "--elastic.group", "0", "--checkpoint.every", "2"]
    record = run / "tokens.0.jsonl"
    with outside(ctx):
        env = {**os.environ, "OMP_NUM_THREADS": "1", **SECRET}
        server = _lighthouse_process(port, out / "lighthouse.0.log")
        try:
            with (out / "group.0.log").open("w") as log:
                held = {**env, "HLAT_ELASTIC_HOLD": "4:2"}  # waits before step 4 for a group that never comes
                group = subprocess.Popen(
                    [sys.executable, "-m", "hlat", "train", *args], stdout=log, stderr=log, env=held
                )
                with ending([group]):
                    deadline = time.monotonic() + DEADLINE_S
                    while not record.exists() or len(record.read_text().splitlines()) < 2 * 3:  # step 3 trained
                        assert group.poll() is None and time.monotonic() < deadline, (out / "group.0.log").read_text()
                        time.sleep(0.1)
                    server.kill()
                    server.wait()
                    code = group.wait(timeout=DEADLINE_S)
            saved = CheckpointManager(run / "checkpoints", None).latest()
            stopped = {"port": port, "exit": code, "saved": str(saved) if saved else None}
            (out / "stopped.json").write_text(json.dumps(stopped))
            (out / "before.jsonl").write_text(record.read_text())
            server = _lighthouse_process(port, out / "lighthouse.1.log")
            done = subprocess.run(
                [sys.executable, "-m", "hlat", "train", *args], capture_output=True, text=True, env=env
            )
        finally:
            server.kill()
            server.wait()
    resumed = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr, "first_pid": group.pid}
    (out / "resumed.json").write_text(json.dumps(resumed))
