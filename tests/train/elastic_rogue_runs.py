"""Scenario function (tests/runs.py) of the rogue at an elastic run's lighthouse
(tests/train/test_elastic_rogue.py asserts on what it leaves), and the rogue itself (this file
run as a script: `_rogue`). Two groups of one process each train under ctx.out/faulty while the
rogue joins four times; beside them one group holding both shares trains uninterrupted under
ctx.out/straight; the lighthouses live in the scenario's process. Most of its time is waiting
(holds for the rogue, its pauses, heartbeats), spent beside the single-process tests. What must
hold while the groups run (nothing of a group or the lighthouse listens on every interface but
the manager server's port the group's log names) is asserted here, and so is that no file of a
group holds the run secret (the secret is this process's: tests/train/elastic_runs.py)."""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import torch

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
if TYPE_CHECKING:
    from runs import ScenarioContext

STEPS, GROUPS = 8, 2
ATTACKS = [
    ("rogue-d", 1, 1),
    ("rogue-a", 3, 0),
    ("rogue-b", 5, 55),
    ("rogue-c", 7, 10**6),
]  # name, after step, its step
HOLD = ",".join(["1:2"] + [f"{after + 1}:3" for _, after, _ in ATTACKS])  # the groups wait for the rogue there


def rogue(ctx: ScenarioContext) -> None:
    """The run described above: groups 0 and 1 at a lighthouse of two (HOLD waits for the rogue
    at each attack), the reference group at one of its own, the rogue (output: ctx.out/rogue.log)
    at the groups' lighthouse. Imports here: the rogue runs this file as a script and needs none
    of them."""
    import contextlib
    import os

    from torchft.coordination import LighthouseServer

    from elastic_runs import DEADLINE_S, SECRET, ending, wait
    from elastic_runs import start_group as start
    from listening import listening
    from runs import outside

    straight, faulty = ctx.out / "straight", ctx.out / "faulty"
    straight.mkdir()
    faulty.mkdir()
    servers = [
        LighthouseServer(bind="127.0.0.1:0", min_replicas=n, join_timeout_ms=1000, heartbeat_timeout_ms=1500)
        for n in (1, 2)
    ]
    extra = ("--train.steps", str(STEPS), "--elastic.max_groups", str(GROUPS), "--elastic.timeout_s", "15")
    extra += ("--schedule.decay_steps", str(STEPS))
    started: list[subprocess.Popen] = []
    rogue_log = ctx.out / "rogue.log"
    with outside(ctx), contextlib.ExitStack() as stack, ending(started):  # processes end before the lighthouses
        for server in servers:
            stack.callback(server.shutdown)
        reference = start(ctx.corpus, straight, servers[0], 0, 1, *extra)
        started.append(reference)
        procs = [start(ctx.corpus, faulty, servers[1], g, 2, *extra, HLAT_ELASTIC_HOLD=HOLD) for g in range(GROUPS)]
        started += procs
        with open(rogue_log, "w") as log:
            rogue = subprocess.Popen(
                [sys.executable, __file__, servers[1].address(), str(faulty)], stdout=log, stderr=subprocess.STDOUT
            )
        started.append(rogue)
        for g, proc in enumerate(procs):
            assert_bound(proc, faulty / f"group{g}.0.log", DEADLINE_S)
        lighthouses = {int(server.address().rsplit(":", 1)[1]) for server in servers}
        assert not wildcards([s for s in listening(os.getpid()) if s[1] in lighthouses]), listening(os.getpid())
        for proc in procs:
            wait(proc, faulty)
        wait(reference, straight)
        assert rogue.wait(timeout=DEADLINE_S) == 0, rogue_log.read_text()[-3000:]
    secret = next(iter(SECRET.values()))
    for path in (p for p in faulty.rglob("*") if p.is_file()):
        assert secret.encode() not in path.read_bytes(), path


def wildcards(sockets: list[tuple[str, int]]) -> set[int]:
    """The ports of `sockets` (listening.listening) that listen on every interface."""
    return {port for address, port in sockets if ipaddress.ip_address(address).is_unspecified}


def assert_bound(proc: subprocess.Popen, log: Path, deadline_s: float) -> None:
    """Once the group met the others (its store, state server, manager server and gloo listen),
    the only socket of it on every interface is the one its start-up log names."""
    from listening import listening

    deadline = time.monotonic() + deadline_s
    while "present at step 1 " not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    named = re.search(r"manager server listens on every interface at TCP port (\d+)", log.read_text())
    assert named, log.read_text()[-3000:]
    sockets = listening(proc.pid)
    assert wildcards(sockets) == {int(named.group(1))}, sockets


def _rogue(lighthouse: str, run: Path) -> None:
    """The attacks, in order, each as a fresh torchft replica with a key of its own."""
    from torch.distributed import ReduceOp, TCPStore
    from torchft import Manager, ProcessGroupGloo

    from hlat.train.elastic.transport import AuthenticatedTransport

    class Careless(AuthenticatedTransport):
        """hlat's transfer, but serving anyone, with a MAC under a key of its own."""

        def _admit(self, step, *proof):
            with self._changed:
                self._sending += 1
                return self._state

    timeout = timedelta(seconds=5)
    for name, after, step in ATTACKS:
        while not any(
            json.loads(line)["step"] >= after
            for f in run.glob("group*/tokens.*.jsonl")
            for line in f.read_text().splitlines()
        ):
            time.sleep(0.1)
        weights = {"module": {"w": torch.zeros(64)}, "fingerprint": "c" * 16 if name == "rogue-c" else "0" * 16}
        loaded = []
        transport = Careless(
            key=secrets.token_bytes(32), fingerprint=weights["fingerprint"], host="127.0.0.1", timeout=timeout,
            own_state=lambda: weights, say=lambda line, key: print(line, flush=True),
        )  # fmt: skip
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout), load_state_dict=loaded.append, state_dict=lambda: weights,
            min_replica_size=1, use_async_quorum=False, timeout=timeout, quorum_timeout=timedelta(seconds=60),
            connect_timeout=timeout, rank=0, world_size=1, store_addr="127.0.0.1", store_port=store.port,
            lighthouse_addr=lighthouse, replica_id=name, hostname="127.0.0.1", checkpoint_transport=transport,
            init_sync=False,
        )  # fmt: skip
        manager.load_state_dict({"step": step, "batches_committed": 0})
        manager.start_quorum()
        members, rank = manager.num_participants(), manager.participating_rank() or 0
        claim = torch.zeros(members, 112, dtype=torch.uint8)  # its name, no fingerprint, a guessed MAC
        claim[rank, : len(name)] = torch.tensor(list(name.encode()), dtype=torch.uint8)
        claim[rank, 80:] = torch.randint(0, 256, (32,), dtype=torch.uint8)
        for tensor in (torch.randint(0, 256, (members, 32), dtype=torch.uint8), claim):
            manager.allreduce(tensor, reduce_op=ReduceOp.SUM).wait()
        lengths = torch.zeros(members, GROUPS, dtype=torch.int64)
        lengths[rank] = 1 << 45  # (d): 32 TiB a share
        manager.allreduce(lengths, reduce_op=ReduceOp.SUM).wait()
        manager.should_commit()
        print(f"{name}: {members} members, healed={manager.current_step() != step}", flush=True)
        print("rogue: loaded something" if loaded else "rogue: loaded nothing", flush=True)
        manager.shutdown(wait=False)
        time.sleep(3)  # the lighthouse forgets it (heartbeat timeout) before the next one


if __name__ == "__main__":
    _rogue(sys.argv[1], Path(sys.argv[2]))
