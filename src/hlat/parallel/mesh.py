"""Process group and DeviceMesh: the one description of the layout that everything else asks.

The mesh's dims are (pp, dp, cp, tp); under HSDP (parallel.dp_shard < dp) they are (pp,
dp_replicate, dp_shard, cp, tp) and "dp" is the flattened (dp_replicate, dp_shard) dim, so whatever
works on the data-parallel group (the data loader's rank, token counts, loss sums) asks for "dp"
either way. cp (context parallel) ranks share a dp coordinate (the same sequences, each its own
chunks of them: hlat.parallel.context_parallel); with cp > 1 "dp_cp", dp and cp flattened, is what
gradients are averaged over (as torchtitan does); under HSDP FSDP2 then shards over dp_shard x cp
within a replica (a 2-D mesh of its own, "dp_replicate" x "dp_shard_cp").
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hlat.config.layout import Degrees, resolve_degrees
from hlat.config.parallel import ParallelConfig
from hlat.device.record import device_record
from hlat.device.runtime import set_device
from hlat.errors import UserError
from hlat.parallel.world import world_from_env


@dataclass
class Layout:
    """The degrees and this process's coordinates; `mesh` is None for a single process."""

    world: int
    rank: int
    degrees: Degrees
    mesh: DeviceMesh | None
    flat_dp: DeviceMesh | None = None  # HSDP's flattened (dp_replicate, dp_shard): what "dp" means then
    dp_cp: DeviceMesh | None = None  # (dp, cp) flattened when cp > 1: gradients are averaged over it
    hsdp_cp: DeviceMesh | None = None  # HSDP with cp > 1: (dp_replicate, dp_shard x cp), FSDP2's mesh

    @property
    def pp(self) -> int:
        return self.degrees.pp

    @property
    def dp(self) -> int:
        return self.degrees.dp

    @property
    def dp_replicate(self) -> int:
        return self.degrees.dp_replicate

    @property
    def dp_shard(self) -> int:
        return self.degrees.dp_shard

    @property
    def cp(self) -> int:
        return self.degrees.cp

    @property
    def tp(self) -> int:
        return self.degrees.tp

    @property
    def summary(self) -> str:
        return self.degrees.summary()

    def submesh(self, dim: str) -> DeviceMesh:
        # torch asks callers to keep a flattened mesh rather than slice it from the root again
        if dim == "dp_cp":
            return self.dp_cp if self.dp_cp is not None else self.submesh("dp")
        return self.flat_dp if dim == "dp" and self.flat_dp is not None else self.mesh[dim]

    def coordinate(self, dim: str) -> int:
        return 0 if self.mesh is None else self.submesh(dim).get_local_rank()

    def group(self, dim: str) -> dist.ProcessGroup | None:
        return None if self.mesh is None else self.submesh(dim).get_group()

    @property
    def dp_rank(self) -> int:
        return self.coordinate("dp")

    @property
    def cp_rank(self) -> int:
        return self.coordinate("cp")

    @property
    def pp_rank(self) -> int:
        return self.coordinate("pp")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(cfg: ParallelConfig, device: torch.device) -> Layout:
    """Make `device` current, join the process group torchrun prepared (if any) and build the (pp,
    dp, cp, tp) mesh. The group's backend is the device's, with gloo beside it for host tensors
    (hlat.device.record): checkpoint listings, doctor's results and start-up host names travel as
    pickled objects, and a few flags and counters as host tensors."""
    world = world_from_env()[0]
    degrees = resolve_degrees(cfg, world)
    set_device(device)  # the local rank's (hlat.device.resolve picked it)
    if world == 1:
        return Layout(1, 0, degrees, None)
    if not dist.is_initialized():
        backend = device_record(device.type).process_group_backend
        if backend is None:
            raise UserError(
                f"{world} processes on {device.type}, but no torch.distributed backend is registered for "
                f"that device type (its package registers one with Backend.register_backend(..., devices="
                f"[{device.type!r}])); launch one process or use --train.device cpu"
            )
        timeout = collective_timeout()
        store = restart_store(timeout)
        if store is None:
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            dist.init_process_group(
                backend=backend, timeout=timeout, store=store, rank=int(os.environ["RANK"]), world_size=world
            )
    return make_layout(degrees, device)


def collective_timeout() -> datetime.timedelta:
    """How long a collective waits for the slowest rank before failing (hlat.parallel.hang names it).

    HLAT_COLLECTIVE_TIMEOUT_S (seconds) takes precedence over HLAT_COLLECTIVE_TIMEOUT_MIN (default 30).
    """
    for name, unit in (("HLAT_COLLECTIVE_TIMEOUT_S", 1), ("HLAT_COLLECTIVE_TIMEOUT_MIN", 60)):
        value = os.environ.get(name)
        if value:
            try:
                seconds = float(value) * unit
            except ValueError:
                seconds = 0.0
            if seconds <= 0:
                raise ValueError(
                    f"{name}={value!r} is not a positive number; set it to a timeout like 600 (seconds) or unset it"
                )
            return datetime.timedelta(seconds=seconds)
    return datetime.timedelta(minutes=30)


def restart_store(timeout: datetime.timedelta) -> dist.Store | None:
    """Under torchrun's shared agent store, a namespace per restart attempt; else None (env://).

    torchrun (--max-restarts) keeps one TCP store across attempts, so a restarted group would
    read the previous attempt's gloo addresses and fail with "connectFullMesh ... Connection
    refused". Prefixing every key with the attempt number gives each attempt clean keys.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    return dist.PrefixStore(f"hlat/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def make_layout(degrees: Degrees, device: torch.device) -> Layout:
    """A layout over the already-initialised process group (several may coexist, e.g. in tests);
    dp_replicate > 1 splits dp into (dp_replicate, dp_shard) for HSDP."""
    d = degrees
    if d.dp_replicate > 1:
        names = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
        mesh = init_device_mesh(device.type, (d.pp, d.dp_replicate, d.dp_shard, d.cp, d.tp), mesh_dim_names=names)
        flat = mesh["dp_replicate", "dp_shard"]._flatten("dp")  # dp rank = replica x dp_shard + shard
    else:
        names, flat = ("pp", "dp", "cp", "tp"), None
        mesh = init_device_mesh(device.type, (d.pp, d.dp, d.cp, d.tp), mesh_dim_names=names)
    dp_cp = hsdp_cp = None
    if d.cp > 1:
        dp_cp = mesh[(*names[1:-2], "cp")]._flatten("dp_cp")  # the dp dims (one, or HSDP's two) and cp
    if d.cp > 1 and d.dp_replicate > 1:  # unflattened, not sliced from the root (which torch deprecates)
        hsdp_cp = dp_cp._unflatten(0, (d.dp_replicate, d.dp_shard * d.cp), ("dp_replicate", "dp_shard_cp"))
    layout = Layout(dist.get_world_size(), dist.get_rank(), degrees, mesh, flat, dp_cp, hsdp_cp)
    timeout = collective_timeout()
    for dim in {*names, "dp", "dp_cp"}:  # sub-groups are created with torch's default timeout, not the world's
        dist.distributed_c10d._set_pg_timeout(timeout, layout.group(dim))
    for group in hsdp_cp.get_all_groups() if hsdp_cp is not None else ():
        dist.distributed_c10d._set_pg_timeout(timeout, group)
    return layout


def fsdp_mesh(layout: Layout) -> DeviceMesh:
    """The mesh FSDP2 shards over: 1-D dp (dp_cp with context parallelism), or 2-D (dp_replicate,
    dp_shard; dp_shard x cp with context parallelism) for HSDP, where fully_shard shards within a
    replica and all-reduces gradients across replicas."""
    if layout.dp_replicate == 1:
        return layout.submesh("dp_cp")
    return layout.hsdp_cp if layout.hsdp_cp is not None else layout.mesh["dp_replicate", "dp_shard"]


def teardown() -> None:
    """Leave the process group cleanly: barrier first so no rank exits while others still talk."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
