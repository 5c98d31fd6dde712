"""hlat doctor: pre-flight checks of a configured run, as one process or under torchrun."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from hlat.commands.common import OVERRIDES_HELP, add_config_args, load_run_config

if TYPE_CHECKING:
    from hlat.commands.preflight import Check


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "doctor",
        allow_abbrev=False,
        help="pre-flight checks: devices, layout, collective latency and bandwidth, disk",
        description="Check what the configured run needs before starting it: the devices each rank sees, that "
        "pp x dp x tp fits the world size, an all_reduce round trip and its bandwidth (each with a timeout that "
        "names a missing rank), free disk for the checkpoints, and a writable run directory. Launch it like "
        "`hlat train` (same config arguments; under torchrun for the collective checks). " + OVERRIDES_HELP,
        epilog="example: torchrun --nproc_per_node 8 -m hlat doctor --preset hlat-7b --parallel.tp 2",
    )
    add_config_args(parser)
    parser.add_argument(
        "--bandwidth-mib", type=float, default=64.0, help="fp32 all_reduce size for the bandwidth test (default 64)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a collective may wait for a missing rank before the check fails (default 60)",
    )


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hlat.parallel.world import world_from_env

    world, rank, local_rank = world_from_env()
    cfg = load_run_config(args, overrides)  # the layout is a check of the table, not an error
    from hlat.commands import preflight  # torch: after the config's checks
    from hlat.device.resolve import resolve_device
    from hlat.parallel.mesh import setup, teardown

    cfg.fit_micro_batch(world)  # as hlat train would
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    os.environ["HLAT_COLLECTIVE_TIMEOUT_S"] = str(args.timeout)  # read by mesh.setup and the hang report
    checks = [
        preflight.check_devices(cfg.train.device, rank, local_rank, local_world),
        preflight.check_layout(cfg, world),
    ]
    if cfg.elastic.enabled:
        checks.append(preflight.check_lighthouse(cfg))
    if local_rank == 0:  # one per node: the run directory may be node-local or shared
        checks += [preflight.check_writable(cfg.run_dir, rank), preflight.check_disk(cfg, rank)]
    healthy = world == 1
    if not any(c.failed for c in checks):
        device = resolve_device(cfg.train.device, "--train.device", local_rank)  # checked by check_devices
        layout = setup(cfg.parallel, device)
        latency = preflight.check_latency(layout, device)
        bandwidth = (
            preflight.check_bandwidth(layout, device, args.bandwidth_mib)
            if not latency.failed
            else preflight.Check("all_reduce bandwidth", None, "skip", "the round trip failed")
        )
        checks += [latency, bandwidth]
        healthy = not latency.failed and not bandwidth.failed
    if world > 1:
        for check in checks:
            print(f"[rank {rank}] {line(check)}", flush=True)
    everyone = gather(checks, world) if healthy else checks
    if rank == 0:
        print(table(cfg.name, world, everyone, gathered=healthy), flush=True)
    code = 1 if any(c.failed for c in everyone) else 0
    if world > 1:
        if healthy:
            teardown()
        # Leave without interpreter teardown (as hlat train does): gloo's threads can race it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def gather(checks: list[Check], world: int) -> list[Check]:
    """Every rank's results, in check order (one all_gather_object over a healthy group)."""
    if world == 1:
        return checks
    import torch.distributed as dist

    per_rank: list[list[Check]] = [[] for _ in range(world)]
    dist.all_gather_object(per_rank, checks)
    order = {c.name: i for i, c in enumerate(checks)}
    # a group-wide result (rank None) is the same everywhere: rank 0's stands for all
    everyone = [c for i, rank_checks in enumerate(per_rank) for c in rank_checks if c.rank is not None or i == 0]
    return sorted(everyone, key=lambda c: (order.get(c.name, len(order)), c.rank or 0))


def line(check: Check) -> str:
    return f"{check.status:<4}  {check.name}: {check.figure}" + (f"\n      fix: {check.fix}" if check.fix else "")


def table(name: str, world: int, checks: list[Check], gathered: bool) -> str:
    rows = [("check", "rank", "result", "figure")] + [
        (c.name, "all" if c.rank is None else str(c.rank), c.status, c.figure) for c in checks
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    out = [f"hlat doctor: {name}, {world} process{'es' if world > 1 else ''}"]
    out += ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    failed = [c for c in checks if c.failed]
    out += [f"FAIL {c.name}{'' if c.rank is None else f' (rank {c.rank})'}: {c.fix}" for c in failed]
    if not gathered:
        out.append("(rank 0's results only: the group could not gather the others')")
    out.append(f"{len(failed)} check(s) failed" if failed else "all checks passed")
    return "\n".join(out)
