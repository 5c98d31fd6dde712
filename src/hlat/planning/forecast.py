"""What `hlat plan` says about time and money: the system a plan runs on, its predicted step, the
days to a token budget and their cost."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from hlat.accelerators import Accelerator, by_table_name
from hlat.config.run import RunConfig
from hlat.errors import UserError
from hlat.metrics.cpu_peak import cpu_peak, read_cpu_facts
from hlat.planning.calibration import efficiencies
from hlat.planning.throughput import StepTime, System, step_time
from hlat.precision import compute_dtype
from hlat.progress import duration


@dataclass(frozen=True)
class Figures:
    """Custom figures from the command line; each replaces the named device's (None: keep it)."""

    peak_tflops: float | None = None
    memory_gib: float | None = None
    intra_gbs: float | None = None
    inter_gbs: float | None = None
    per_node: int | None = None
    efficiency: float | None = None


def make_system(device: str | None, figures: Figures, cfg: RunConfig, world: int) -> System | None:
    """The system to predict on: a table row, "cpu" (this machine, as the trainer's MFU sees it) or
    custom figures alone (--peak-tflops and --memory-gib); None when none is given."""
    dtype = compute_dtype(cfg.precision.mode, torch.device("cpu") if device == "cpu" else None)
    if device == "cpu":
        peak = cpu_peak(read_cpu_facts(), torch.get_num_threads(), dtype)
        if peak is None and figures.peak_tflops is None:
            raise UserError("--device cpu: this CPU's peak is unknown (instruction set or clock); pass --peak-tflops")
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3, 1)
        base = System("this CPU", peak.gflops / 1e3 if peak else 0.0, memory, world, 0.0, 0.0, "cpu", 0.0)
    elif device:
        row: Accelerator = by_table_name(device)
        base = System(
            row.name,
            row.peak_tflops(dtype, tf32=False),
            row.memory_gib,
            row.per_node or 1,
            row.intra_gbs,
            row.inter_gbs,
            row.calibration_group,
            0.0,
            row.rank,
        )
    elif figures.peak_tflops is not None and figures.memory_gib is not None:
        base = System("custom", 0.0, 0.0, 1, 0.0, 0.0, "gpu", 0.0)  # the gpu group's constant unless --efficiency
    elif any(v is not None for v in vars(figures).values()):
        raise UserError(
            "custom figures without --device need at least --peak-tflops and --memory-gib "
            '(or name a device to change its figures: --device "H100 SXM" --inter-gbs 25)'
        )
    else:
        return None
    pick = lambda given, default: default if given is None else given
    system = System(
        base.name,
        pick(figures.peak_tflops, base.peak_tflops),
        pick(figures.memory_gib, base.memory_gib),
        pick(figures.per_node, base.per_node),
        pick(figures.intra_gbs, base.intra_gbs),
        pick(figures.inter_gbs, base.inter_gbs),
        base.calibration_group,
        pick(figures.efficiency, efficiencies()[base.calibration_group]),
        base.rank,
    )
    if world > system.per_node and system.inter_gbs <= 0:
        raise UserError(
            f"{system.name}: {world} ranks span nodes of {system.per_node} and no network bandwidth is known; "
            "pass --per-node (ranks per node) and --inter-gbs (GB/s per rank across nodes)"
        )
    return system


def nodes_of(system: System, world: int) -> int:
    return math.ceil(world / max(system.per_node, 1))


def days_and_cost(
    tokens_per_s: float, budget_tokens: float, nodes: int, price_per_node_hour: float
) -> tuple[float, float]:
    """(days to train `budget_tokens` at `tokens_per_s`, their cost on `nodes` nodes)."""
    days = budget_tokens / tokens_per_s / 86400
    return days, days * 24 * nodes * price_per_node_hour


def format_forecast(step: StepTime, system: System, world: int, budget_tokens: float, price: float) -> str:
    """Step split, tokens/s, MFU, days to the budget and (with a price) cost."""
    nodes = nodes_of(system, world)
    days, cost = days_and_cost(step.tokens_per_s, budget_tokens, nodes, price)
    lines = [
        f"predicted on {world} x {system.name} ({nodes} node{'s' * (nodes > 1)} of {system.per_node}; {system.calibration_group} "
        f"efficiency {system.efficiency:.3f}, hlat plan --calibration): step {step.total_s:.3g} s = compute {step.compute_s:.3g} "
        f"+ tensor parallel {step.tp_s:.3g}{f' + context-parallel ring {step.cp_s:.3g}' if step.cp_s else ''} + data parallel (exposed) {step.dp_s:.3g} + pipeline sends {step.pp_s:.3g} "
        f"+ bubble {step.bubble_s:.3g}",
        f"{step.tokens_per_s:,.0f} tokens/s ({step.tokens_per_s / world:,.0f} per rank), MFU {step.mfu:.1%}; "
        f"{budget_tokens:.3g} tokens in {days:.3g} days",
    ]
    if system.intra_gbs == 0 and world > 1:
        lines.append(
            f"note: no intra-node bandwidth known for {system.name}: traffic within a node is not counted "
            "(--intra-gbs sets it)"
        )
    if price:
        lines.append(
            f"cost at {price:,.2f} per node-hour: {cost:,.0f} ({cost / budget_tokens * 1e12:,.0f} per trillion "
            f"tokens, {cost / budget_tokens * 1e6:.4f} per million)"
        )
    return "\n".join(lines)


def run_estimate(cfg: RunConfig, world: int, device: str, peak_tflops: float, steps: int) -> str | None:
    """The line a run prints before its first step: `hlat plan`'s predicted step on `device` (a
    table row, or "cpu") at the trainer's peak, and `steps` of them; None where the planner has no
    model of the system (a multi-node run without a network figure)."""
    try:
        system = make_system(device, Figures(peak_tflops=peak_tflops), cfg, world)
    except UserError:
        system = None
    if system is None:
        return None
    step = step_time(cfg, world, system)
    return (
        f"estimate (hlat plan's model at {system.efficiency:.0%} of {peak_tflops * 1e3:,.4g} GFLOP/s per rank, "
        f"not a measurement): {step.total_s:.3g} s a step, {duration(step.total_s * steps)} for {steps:,} steps"
    )
