"""Scenario function (tests/runs.py) for elastic replica groups of several processes, and the
helpers of their test (tests/train/test_elastic_groups.py): each group a torchrun job of RANKS
ranks, started from the scenario process with the lighthouses there. Most of its time is waiting
(holds, heartbeats, a group killed and restarted), spent beside the single-process tests."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
from elastic_runs import DEADLINE_S, SECRET, ending, lighthouse  # noqa: E402
from runs import ScenarioContext, outside, start_torchrun, tiny_args  # noqa: E402

GROUPS, RANKS, STEPS, KILL = 2, 2, 6, 3  # group 1 dies before step KILL and is restarted after step KILL + 1
ELASTIC = [
    "--train.global_batch", "4", "--train.micro_batch", "1", "--train.steps", str(STEPS),
    "--parallel.compile", "false", "--parallel.dp_sharding", "fsdp", "--elastic.enabled", "true",
    "--elastic.max_groups", str(GROUPS), "--elastic.timeout_s", "60", "--elastic.secret_env", "HLAT_TEST_RUN_SECRET",
    "--schedule.warmup_steps", "2", "--schedule.decay_steps", "4",
]  # fmt: skip


def start_group(
    corpus: Path,
    run: Path,
    server,
    group: int,
    *extra: str,
    min_groups: int = 1,
    elastic: list[str] = ELASTIC,
    **env: str,
):
    args = tiny_args(corpus, run / f"group{group}", *elastic, *extra)
    args += ["--elastic.lighthouse", server.address(), "--elastic.group", str(group)]
    args += ["--elastic.min_groups", str(min_groups)]
    log = run / f"group{group}.{len(list(run.glob(f'group{group}.*.log')))}.log"
    return start_torchrun(RANKS, ["-m", "hlat", "train", *args], log, {**SECRET, **env})


def workers(torchrun_pid: int) -> set[int]:
    """The processes torchrun started (its children)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == torchrun_pid:
            found.add(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def records(run: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(run.glob("group*/tokens.*.jsonl")) for line in f.read_text().splitlines()]


def wait(proc, run: Path) -> None:
    code = proc.wait(timeout=DEADLINE_S)
    assert code == 0, "\n".join(f.read_text()[-4000:] for f in sorted(run.glob("*.log")))


def killed_restarted(ctx: ScenarioContext) -> None:
    """Two groups of two ranks (FSDP2) under ctx.out/faulty, rank 0 of group 1 killed before step
    KILL (torchrun ends its peer: asserted here), group 1 restarted after KILL + 1. Beside them,
    uninterrupted: one group of two ranks holding both shares (ctx.out/straight), two groups of
    tp 2 (ctx.out/tp) and one group of pp 2 holding both shares (ctx.out/pp). pids.json: the
    killed group's ranks and the surviving group's."""
    straight, faulty, tp, pp = (ctx.out / name for name in ("straight", "faulty", "tp", "pp"))
    for run in (straight, faulty, tp, pp):
        run.mkdir()
    alone, shared, both, alone_pp = lighthouse(1), lighthouse(1), lighthouse(GROUPS), lighthouse(1)
    started: list = []
    with outside(ctx), ending(started), contextlib.ExitStack() as servers:
        for server in (shared, alone, both, alone_pp):
            servers.callback(server.shutdown)
        # the uninterrupted run: one group of two ranks holding both shares, at a lighthouse of its own
        reference = start_group(ctx.corpus, straight, alone, 0)
        # beside it, uninterrupted too: two groups each running tp over its two ranks, both present every
        # step, and one group of pp 2 holding both shares (a schedule step per share)
        others = {
            proc: run
            for run, server, flag, groups in (
                (tp, both, "tp", GROUPS),
                (pp, alone_pp, "pp", 1),
            )
            for proc in [
                start_group(ctx.corpus, run, server, g, f"--parallel.{flag}", str(RANKS), min_groups=groups)
                for g in range(groups)
            ]
        }
        hold = {"HLAT_ELASTIC_HOLD": f"1:{GROUPS},{KILL + 2}:{GROUPS}"}  # both at step 1, and again at KILL + 2
        fault = {"HLAT_FAULT": f"step:{KILL}:0", "HLAT_FAULT_MARKER": str(ctx.out / "killed")}
        procs = [start_group(ctx.corpus, faulty, shared, g, **hold, **(fault if g == 1 else {})) for g in range(GROUPS)]
        started += [reference, *others, *procs]
        deadline = time.monotonic() + DEADLINE_S
        while len(dead := workers(procs[1].pid)) < RANKS:  # group 1's two ranks, to see both go
            assert time.monotonic() < deadline and procs[1].poll() is None, "group 1 did not start"
            time.sleep(0.2)
        assert procs[1].wait(timeout=DEADLINE_S) != 0, "group 1 was not killed"
        assert "killed rank 0" in (ctx.out / "killed").read_text()
        assert "exitcode  : -9" in (faulty / "group1.0.log").read_text()  # rank 0 by the fault, then torchrun
        assert not any(alive(pid) for pid in dead), "a rank of the killed group lives on"  # ended its peer
        while not any(r["step"] == KILL + 1 for r in records(faulty)):  # the survivor trained two steps alone
            assert time.monotonic() < deadline and procs[0].poll() is None, "the survivor stopped"
            time.sleep(0.2)
        survivors = workers(procs[0].pid)
        restarted = start_group(ctx.corpus, faulty, shared, 1, **hold)
        started.append(restarted)
        for proc, run in {procs[0]: faulty, restarted: faulty, reference: straight, **others}.items():
            wait(proc, run)
    (ctx.out / "pids.json").write_text(json.dumps({"dead": sorted(dead), "survivors": sorted(survivors)}))


def replay_excludes_a_group(ctx: ScenarioContext, steps: int, extra: list[str]) -> None:
    """Under train.deterministic with replay every step and recovery.wrong_computation exclude
    (`extra`: their flags), two groups of two FSDP2 ranks in ctx.out, a bit flipped in group 1's
    rank 1 at step 2. exits.json: each group's exit status."""
    elastic = [
        "--train.steps", str(steps), "--parallel.compile", "false", "--parallel.dp_sharding", "fsdp",
        "--elastic.enabled", "true", "--elastic.max_groups", str(GROUPS), "--elastic.timeout_s", "60",
        "--elastic.secret_env", "HLAT_TEST_RUN_SECRET", *extra,
    ]  # fmt: skip
    hold = {"HLAT_ELASTIC_HOLD": f"1:{GROUPS}"}
    flip = {"HLAT_FAULT": "flip:2:1"}
    server = lighthouse(1)
    started: list = []
    with outside(ctx), ending(started), contextlib.ExitStack() as stack:
        stack.callback(server.shutdown)
        procs = [
            start_group(ctx.corpus, ctx.out, server, g, elastic=elastic, **hold, **(flip if g == 1 else {}))
            for g in range(GROUPS)
        ]
        started += procs
        exits = {f"group{g}": proc.wait(timeout=DEADLINE_S) for g, proc in enumerate(procs)}
    (ctx.out / "exits.json").write_text(json.dumps(exits))
