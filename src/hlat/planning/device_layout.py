"""The layout a run takes on its device when `parallel.device_layout = "auto"`.

Where a device's compiled blocks do not take tensor parallelism (hlat.device.record's
`data_parallel_first`: CUDA, whose compiled TP blocks fail in backward, hlat.parallel.compile), a
tp > 1 that came from a preset costs the compiler and the TP collectives for memory a model of up
to 9B parameters does not need: such a run takes tp 1 with FSDP2 over every rank (HSDP where
parallel.dp_shard says so), as torchtitan runs Llama 3 8B on 8 GPUs. The preset's sharding is kept
when the memory plan (hlat.planning.memory) fits the device, else fsdp (ZeRO-3) when that fits;
otherwise, and wherever the config file or command line set tp, the config's layout stands.
"""

from __future__ import annotations

import copy
import dataclasses

from hlat.config.run import RunConfig
from hlat.device.record import DeviceRecord
from hlat.errors import ConfigError
from hlat.model import count_params
from hlat.planning.memory import largest_stage_gib, plan

MAX_PARAMS = 9e9  # "8B and below": Llama 3.1 8B has 8.03B
GIB = 1024**3


def device_layout(
    cfg: RunConfig, world: int, record: DeviceRecord, memory_bytes: int | None
) -> tuple[RunConfig, str | None]:
    """(the config to run on `world` ranks of `record`'s type with `memory_bytes` each (None:
    unknown, nothing changes), the start-up line saying what changed or None)."""
    par = cfg.parallel
    if (
        par.device_layout != "auto"
        or not record.data_parallel_first
        or par.tp == 1
        or "parallel.tp" in cfg.user_set
        or memory_bytes is None
        or count_params(cfg.model) > MAX_PARAMS
    ):
        return cfg, None
    shardings = dict.fromkeys([par.dp_sharding if par.dp_sharding in ("zero2", "fsdp") else "fsdp", "fsdp"])
    for sharding in shardings:
        candidate = copy.deepcopy(cfg)
        candidate.parallel = dataclasses.replace(par, tp=1, dp=0, dp_sharding=sharding)
        candidate.fit_micro_batch(world)
        if candidate.layout_problems(world):
            continue
        try:
            need = largest_stage_gib(plan(candidate, world)[1])
        except ConfigError:
            continue
        if need * GIB <= memory_bytes:
            line = (
                f"layout: tp 1, {sharding} over {world // par.pp} data-parallel ranks instead of the preset's tp {par.tp} "
                f"(parallel.device_layout auto: compiled blocks on {record.type} do not take tensor parallelism; "
                f"{need:.1f} of {memory_bytes / GIB:.0f} GiB per rank planned); --parallel.device_layout config keeps tp {par.tp}"
            )
            return candidate, line
    return cfg, None
