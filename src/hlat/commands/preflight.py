"""Pre-flight checks for a configured run (`hlat doctor`): devices, layout, collectives, disk.

Each check returns a `Check` record; hlat.commands.doctor runs them and prints the table.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch
import torch.distributed as dist

from hlat.config.layout import resolve_degrees
from hlat.config.run import RunConfig
from hlat.device.resolve import resolve_device
from hlat.device.runtime import device_count, device_name, mem_get_info, synchronize
from hlat.errors import UserError
from hlat.model import count_params
from hlat.parallel.hang import CollectiveTimeout, watch
from hlat.parallel.mesh import Layout
from hlat.precision import param_dtype
from hlat.train.elastic.replicas import check_lighthouse as check_lighthouse_answers
from hlat.train.elastic.replicas import import_torchft

GB = 1e9


@dataclass
class Check:
    name: str
    rank: int | None  # None: one result for the whole group
    status: str  # "ok", "FAIL" or "skip"
    figure: str
    fix: str = ""  # what to do about a FAIL

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"


def check_devices(device_setting: str, rank: int, local_rank: int, local_world: int) -> Check:
    """What this rank sees: the accelerator it will use (as `hlat train` resolves train.device), or
    the CPU cores it may use."""
    try:
        device = resolve_device(device_setting, "--train.device", local_rank)
    except UserError as err:
        return Check("devices", rank, "FAIL", f"train.device {device_setting}", str(err))
    if device.type == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        figure = f"cpu, {cores} cores for {local_world} process{'es' if local_world > 1 else ''} on this node"
        return Check("devices", rank, "ok", figure)
    count = device_count(device.type)
    figure = f"{device} of {count}, {device_name(device) or 'name not reported'}"
    memory = mem_get_info(device)
    if memory is not None:
        free, total = memory
        figure += f", {free / 2**30:.0f} of {total / 2**30:.0f} GiB free"
    if local_world > count:
        return Check(
            "devices",
            rank,
            "FAIL",
            figure,
            f"{local_world} processes on this node share {count} {device.type} devices; "
            f"launch torchrun --nproc_per_node {count}",
        )
    return Check("devices", rank, "ok", figure)


def check_layout(cfg: RunConfig, world: int) -> Check:
    """The configured layout fits the launched world size, by the rules `hlat train` applies."""
    problems = cfg.layout_problems(world)
    if problems:
        return Check("layout", None, "FAIL", f"{world} processes launched", "; ".join(f"{f}: {m}" for f, m in problems))
    degrees = resolve_degrees(cfg.parallel, world).summary()
    return Check("layout", None, "ok", f"{degrees} = {world} process{'es' if world > 1 else ''}")


def check_lighthouse(cfg: RunConfig) -> Check:
    """An elastic run: torchft is installed and the lighthouse answers at elastic.lighthouse."""
    try:
        import_torchft()
        check_lighthouse_answers(cfg.elastic.lighthouse, 10.0)
    except UserError as err:
        return Check("lighthouse", None, "FAIL", cfg.elastic.lighthouse or "elastic.lighthouse unset", str(err))
    return Check("lighthouse", None, "ok", f"{cfg.elastic.lighthouse} answers (torchft {metadata.version('torchft')})")


def _timed_all_reduce(tensor: torch.Tensor, iters: int) -> list[float]:
    """Seconds per all_reduce over the world, after one warm-up (which sets up connections)."""
    dist.all_reduce(tensor)
    times = []
    for _ in range(iters):
        synchronize(tensor.device)
        start = time.perf_counter()
        dist.all_reduce(tensor)
        synchronize(tensor.device)
        times.append(time.perf_counter() - start)
    return times


def _slowest(seconds: float, device: torch.device) -> float:
    """The slowest rank's time: a collective is as fast as its last participant."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def check_latency(layout: Layout, device: torch.device, iters: int = 20) -> Check:
    """Round trip of a small all_reduce over the world (median of `iters`)."""
    if layout.world == 1:
        return Check("all_reduce latency", None, "skip", "one process: no collectives")
    try:
        with watch(layout, "doctor: all_reduce round trip", 0):
            ms = _slowest(statistics.median(_timed_all_reduce(torch.ones(8, device=device), iters)), device) * 1e3
    except CollectiveTimeout as err:
        return Check("all_reduce latency", None, "FAIL", "timed out", str(err))
    return Check(
        "all_reduce latency", None, "ok", f"{ms:.3f} ms (8 floats over {layout.world} ranks, median of {iters})"
    )


def check_bandwidth(layout: Layout, device: torch.device, mib: float, iters: int = 5) -> Check:
    """all_reduce bandwidth as nccl-tests define it: algbw = bytes / time, busbw = algbw x 2(n-1)/n."""
    if layout.world == 1:
        return Check("all_reduce bandwidth", None, "skip", "one process: no collectives")
    numel = max(1, int(mib * 2**20) // 4)
    try:
        with watch(layout, f"doctor: all_reduce bandwidth ({mib:g} MiB)", 0):
            seconds = _slowest(statistics.mean(_timed_all_reduce(torch.ones(numel, device=device), iters)), device)
    except CollectiveTimeout as err:
        return Check("all_reduce bandwidth", None, "FAIL", "timed out", str(err))
    n = layout.world
    algbw = numel * 4 / seconds / GB
    busbw = algbw * 2 * (n - 1) / n
    return Check(
        "all_reduce bandwidth",
        None,
        "ok",
        f"{mib:g} MiB fp32: algbw {algbw:.2f} GB/s, busbw {busbw:.2f} GB/s ({seconds * 1e3:.1f} ms, mean of {iters})",
    )


def checkpoint_bytes(cfg: RunConfig) -> tuple[int, str]:
    """Peak bytes the run's checkpoints take, and how that figure was reached.

    keep_last checkpoints plus the one being written (the oldest is deleted once it commits),
    each holding weights and both Adam moments in the precision mode's storage dtype; plus every
    weights-only archive the run will write.
    """
    params = count_params(cfg.model)
    itemsize = param_dtype(cfg.precision.mode).itemsize
    copies = cfg.checkpoint.keep_last + 1
    total = copies * 3 * itemsize * params
    how = f"{copies} checkpoints x {params / 1e6:,.1f}M params x {3 * itemsize} bytes ({cfg.precision.mode} weights + 2 Adam moments)"
    every = cfg.checkpoint.archive_every_tokens
    if every:
        archives = cfg.train.steps * cfg.train.global_batch * cfg.data.seq_len // every
        total += archives * itemsize * params
        how += f" + {archives} weight archives"
    return total, how


def _bytes_under(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds `path` (or would, once created)."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def check_disk(cfg: RunConfig, rank: int) -> Check:
    """Free space where the checkpoints go vs what they will need (less what is already there)."""
    need, how = checkpoint_bytes(cfg)
    have = sum(_bytes_under(cfg.run_dir / name) for name in ("checkpoints", "archive"))  # a resumed run's
    more = max(0, need - have)
    free = free_bytes(cfg.run_dir)
    figure = f"{more / GB:,.2f} GB more needed ({how}), {free / GB:,.2f} GB free"
    if free < more:
        return Check(
            "disk",
            rank,
            "FAIL",
            figure,
            f"free {(more - free) / GB:,.2f} GB under {cfg.run_dir}, lower "
            "--checkpoint.keep_last, or point --train.run_dir at a larger filesystem",
        )
    return Check("disk", rank, "ok", figure)


def check_writable(run_dir: Path, rank: int) -> Check:
    """Create, fsync and delete a file in the run directory, creating the directory if needed and
    removing what it created (a check leaves no empty runs/<preset> behind)."""
    probe = run_dir / f".hlat-doctor-{rank}-{os.getpid()}"
    created = [d for d in (run_dir, *run_dir.parents) if not d.exists()]  # deepest first
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # O_EXCL: never through a link
        try:
            os.write(fd, b"hlat doctor\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
        for directory in created:
            with contextlib.suppress(OSError):  # no longer empty: another node's probe, or a run started
                directory.rmdir()
    except OSError as err:
        return Check(
            "run dir writable",
            rank,
            "FAIL",
            str(run_dir),
            f"{err}; fix the permissions or mount, or choose another --train.run_dir",
        )
    return Check("run dir writable", rank, "ok", str(run_dir))
