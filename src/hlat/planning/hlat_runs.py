"""hlat plan --hlat: the paper's two runs (7B and 70B on 4096 accelerators, 1.8T tokens) on trn1
and on the GPU cluster it weighed them against, in the presets' layouts (HLAT's own, on trn1 over
NeuronCores; the 70B at TP 8 on the GPU nodes, preset hlat-70b-gpu's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hlat.config.load import load_config
from hlat.planning.forecast import Figures, days_and_cost, make_system, nodes_of
from hlat.planning.memory import largest_stage_gib, plan
from hlat.planning.throughput import step_time

PRESETS = ("hlat-7b", "hlat-70b")


@dataclass(frozen=True)
class Cluster:
    device: str
    instance: str
    price_per_node_hour: float  # the hourly prices HLAT's comparison is quoted with (not checked against AWS today)
    ranks_per_accelerator: int = 1
    overrides: dict[str, tuple[str, ...]] = field(default_factory=dict)  # per preset, after the user's


# HLAT's comparison: 4096 accelerators as 256 trn1.32xlarge (16 Trainium chips) or 512 p4d.24xlarge (8 A100 40GB).
# Neuron runs a process per NeuronCore, 2 a trn1 chip: the presets' own layouts (the 70B's TP 32 x
# PP 8; the 7B's 1024 data-parallel ranks get 1024 virtual shards, data.virtual_shards auto). On
# 8-GPU nodes the 70B runs its GPU layout (preset hlat-70b-gpu's TP 8).
HLAT_CLUSTERS = (
    Cluster(
        "trn1",
        "trn1.32xlarge",
        21.50,
        ranks_per_accelerator=2,
    ),
    Cluster("A100 SXM 40GB", "p4d.24xlarge", 32.77, overrides={"hlat-70b": ("--parallel.tp", "8")}),
)
HLAT_WORLD = 4096
HLAT_TOKENS = 1.8e12


def format_hlat_runs(overrides: list[str]) -> str:
    lines = [
        f"HLAT's runs on {HLAT_WORLD} accelerators (trn1: {HLAT_WORLD * 2} NeuronCore ranks) in the presets' layouts, "
        "HLAT's (on the GPUs the 70B at TP 8; `overrides` apply to both presets); days and cost per trillion tokens, "
        "and for the paper's "
        f"{HLAT_TOKENS / 1e12:g}T",
        f"{'preset':<9} {'cluster':<34} {'layout':<22} {'GiB/rank':>8} {'tokens/s':>11} {'MFU':>6} "
        f"{'days/1T':>8} {'cost/1T':>11} {'days':>6} {'cost':>12}",
    ]
    for preset in PRESETS:
        for cluster in HLAT_CLUSTERS:
            world = HLAT_WORLD * cluster.ranks_per_accelerator
            cfg = load_config(preset, None, [*overrides, *cluster.overrides.get(preset, ())], world=world)
            degrees, stages = plan(cfg, world)
            need = largest_stage_gib(stages)
            system = make_system(cluster.device, Figures(), cfg, world)
            step = step_time(cfg, world, system)
            nodes = nodes_of(system, world)
            days, cost = days_and_cost(step.tokens_per_s, 1e12, nodes, cluster.price_per_node_hour)
            where = f"{nodes} x {cluster.instance} at ${cluster.price_per_node_hour:.2f}/h"
            fits = "" if need <= system.memory_gib else " (does NOT fit)"
            lines.append(
                f"{preset:<9} {where:<34} {f'pp {degrees.pp} x dp {degrees.dp} x tp {degrees.tp}':<22} {need:>8.1f} "
                f"{step.tokens_per_s:>11,.0f} {step.mfu:>6.1%} {days:>8.1f} {cost:>11,.0f} "
                f"{days * HLAT_TOKENS / 1e12:>6.1f} {cost * HLAT_TOKENS / 1e12:>12,.0f}{fits}"
            )
    lines.append(
        "predicted with the calibrated efficiencies (hlat plan --calibration); hourly prices as quoted for HLAT's comparison"
    )
    return "\n".join(lines)
