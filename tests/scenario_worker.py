"""Run the scenarios of OUT/plan.json in order, under one torchrun launch (see tests/runs.py).

`python -m torch.distributed.run --nproc_per_node N scenario_worker.py OUT`. Each scenario of
world W runs on ranks 0..W-1 in a fresh gloo group over torchrun's store (its keys prefixed by
the scenario's index, so groups never read each other's addresses) on its device's backend; the environment says world W
and this rank, so hlat's own setup (hlat.parallel.mesh.setup) joins that group. World 1 runs
without a group. A scenario that raises leaves OUT/<name>/error.rank<r>.txt and the next one
runs; one that finishes leaves OUT/<name>/done.rank<r>.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import resource
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._redistribute import clear_redistribute_planner_cache

sys.path.insert(0, str(Path(__file__).parent))

from hlat.device.record import device_record  # noqa: E402
from hlat.parallel.mesh import collective_timeout  # noqa: E402
from runs import ARRIVAL_TIMEOUT_S, PLAN, ScenarioContext  # noqa: E402


def join_group(index: int, rank: int, world: int, device: str) -> None:
    """Form the scenario's group. Ranks that skipped the scenarios before it arrive minutes early:
    they wait at an arrival barrier bounded by the launch's own deadline (ARRIVAL_TIMEOUT_S), so
    only the group's collectives run under the short collective timeout."""
    prefix = f"scenario_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}_{index}"
    store = dist.PrefixStore(
        prefix,
        dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=ARRIVAL_TIMEOUT_S),
        ),
    )
    store.set(f"arrived/{rank}", "1")
    store.wait([f"arrived/{r}" for r in range(world)])
    backend = device_record(device).process_group_backend  # what hlat.parallel.mesh.setup would start
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=collective_timeout())


def cpu_seconds() -> float:
    """This process's CPU time and that of the children it waited for (a scenario's own processes)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def forget_meshes() -> None:
    """Drop DTensor's caches of sharding decisions and redistribution plans. They are keyed by
    DeviceMesh equality, which ignores process groups: without this, a later scenario whose mesh
    equals an earlier one's (same ranks, dims and names) reuses plans that name the destroyed
    groups and fails with "Could not resolve the process group". The two sharding caches are
    cleared as torch.distributed.tensor.debug._clear_sharding_prop_cache does: importing that
    module imports torch's runtime estimator and inductor (0.5 CPU-s a rank)."""
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    torch._C._clear_DTensor_sharding_propagator_cache()
    clear_redistribute_planner_cache()


def load(call: str):
    """ "FILE:function", FILE relative to tests/ (loaded by path: tests/ holds no packages)."""
    file, function = call.split(":")
    path = Path(__file__).parent / file
    name = "scenario_" + "_".join(path.relative_to(Path(__file__).parent).with_suffix("").parts)
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return getattr(sys.modules[name], function)


def main() -> None:
    root = Path(sys.argv[1])
    plan = json.loads((root / PLAN).read_text())
    rank = int(os.environ.get("RANK", 0))
    # Import every scenario's module before any scenario runs: a module may register a device at
    # import (tests/device), and torch's autograd engine sizes its per-device queues at the first
    # backward in the process, so a device registered after one cannot run a backward.
    for spec in plan["scenarios"]:
        with contextlib.suppress(Exception):  # a module that fails to import fails its scenario below
            load(spec["call"])
    for index, spec in enumerate(plan["scenarios"]):
        world = spec["world"]
        if rank >= world:
            continue
        out = root / spec["name"]
        out.mkdir(parents=True, exist_ok=True)
        os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
        started, cpu = time.perf_counter(), cpu_seconds()
        try:
            fn = load(spec["call"])
            if world > 1:
                join_group(index, rank, world, spec["device"])
            fn(ScenarioContext(out, root, Path(plan["corpus"]), rank, world), **spec["kwargs"])
            if dist.is_initialized():  # (a run of `hlat train` leaves its group itself, after a barrier)
                dist.barrier()  # nobody reports done while another rank of the scenario still works
            (out / f"done.rank{rank}").touch()
        except Exception:
            (out / f"error.rank{rank}.txt").write_text(f"rank {rank}:\n{traceback.format_exc()}")
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            forget_meshes()
            (out / f"cpu.rank{rank}").write_text(f"{cpu_seconds() - cpu:.2f}")
            if rank == 0:  # what each scenario costs, for the launch's timeout budget
                print(f"scenario {spec['name']}: {time.perf_counter() - started:.1f} s", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown racing gloo's threads (see hlat.commands.train)


if __name__ == "__main__":
    main()
