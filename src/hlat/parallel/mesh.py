"""Process group and DeviceMesh: the one description of the layout that everything else asks."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hlat.errors import ConfigError
from hlat.parallel.config import ParallelConfig


@dataclass
class Layout:
    """Sizes and this process's coordinates; `mesh` is None for a single process."""

    world: int
    rank: int
    pp: int
    dp: int
    tp: int
    mesh: DeviceMesh | None

    def coordinate(self, dim: str) -> int:
        return 0 if self.mesh is None else self.mesh[dim].get_local_rank()

    def group(self, dim: str) -> dist.ProcessGroup | None:
        return None if self.mesh is None else self.mesh[dim].get_group()

    @property
    def dp_rank(self) -> int:
        return self.coordinate("dp")

    @property
    def pp_rank(self) -> int:
        return self.coordinate("pp")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world_from_env() -> tuple[int, int, int]:
    """(world size, global rank, local rank) as set by torchrun; a plain run is (1, 0, 0)."""
    return int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))


def resolve_degrees(cfg: ParallelConfig, world: int) -> tuple[int, int, int]:
    """(pp, dp, tp) for this world size, or a ConfigError naming the field and the fix."""
    inner = cfg.tp * cfg.pp
    if world % inner:
        raise ConfigError([("parallel.tp", f"tp={cfg.tp} x pp={cfg.pp} = {inner} does not divide the world size {world}; launch a multiple of {inner} processes")])
    dp = cfg.dp or world // inner
    if dp * inner != world:
        raise ConfigError([("parallel.dp", f"pp={cfg.pp} x dp={dp} x tp={cfg.tp} = {dp * inner} processes, but {world} were launched; set --parallel.dp {world // inner} or 0")])
    return cfg.pp, dp, cfg.tp


def setup(cfg: ParallelConfig, device: torch.device) -> Layout:
    """Join the process group torchrun prepared (if any) and build the (pp, dp, tp) mesh."""
    world, _, local_rank = world_from_env()
    pp, dp, tp = resolve_degrees(cfg, world)
    if world == 1:
        return Layout(1, 0, 1, 1, 1, None)
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        backend = {"cuda": "nccl", "cpu": "gloo"}.get(device.type)  # XLA: "xla" via torch_xla
        timeout = collective_timeout()
        store = restart_store(timeout)
        if store is None:
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            dist.init_process_group(backend=backend, timeout=timeout, store=store, rank=int(os.environ["RANK"]), world_size=world)
    return make_layout(pp, dp, tp, device)


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
                raise ValueError(f"{name}={value!r} is not a positive number; set it to a timeout like 600 (seconds) or unset it")
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


def make_layout(pp: int, dp: int, tp: int, device: torch.device) -> Layout:
    """A layout over the already-initialised process group (several may coexist, e.g. in tests)."""
    mesh = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    timeout = collective_timeout()
    for dim in ("pp", "dp", "tp"):  # sub-groups are created with torch's default timeout, not the world's
        dist.distributed_c10d._set_pg_timeout(timeout, mesh[dim].get_group())
    return Layout(dist.get_world_size(), dist.get_rank(), pp, dp, tp, mesh)


def teardown() -> None:
    """Leave the process group cleanly: barrier first so no rank exits while others still talk."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
