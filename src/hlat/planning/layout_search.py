"""hlat plan --search: every layout of a config on `world` ranks that fits in memory, fastest first.

The knobs: tensor parallel (divisors of the world up to a node), pipeline stages (1F1B, up to 16
and the layer count), context parallel (powers of two), data parallel as ddp, zero1, zero2, fsdp,
or HSDP (fsdp sharded within a node, replicated across: parallel.dp_shard), micro-batch (powers
of two dividing the per-rank batch) and recompute policy. Memory is the dry-run plan's (hlat.planning.memory), which builds the
model once and tensor-parallelises it once per tp; each (tp, pp) is cut from it and each variant
re-priced from its stages' parameter counts; layouts hlat refuses (ddp or zero1 with tp or pp, a
tp the heads do not allow, HSDP, zero1, selective recompute or a seq_len that does
not cut into 2 x cp chunks: hlat.config.layout's rules) are skipped.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from hlat.config.fields import choices
from hlat.config.layout import check_context_parallel, check_data_parallel, check_grad_accum, resolve_degrees
from hlat.config.parallel import ParallelConfig
from hlat.config.run import RunConfig
from hlat.errors import ConfigError
from hlat.planning.forecast import days_and_cost
from hlat.planning.memory import GIB, StagePlan, plan, stage_memory
from hlat.planning.throughput import LayoutChoice, StepTime, System, step_time

SHARDINGS = ("ddp", "zero1", "zero2", "fsdp", "hsdp")
MAX_PP = 16


@dataclass(frozen=True)
class Candidate:
    layout: LayoutChoice
    memory_gib: float  # the largest stage's, per rank
    step: StepTime


def search(cfg: RunConfig, world: int, system: System) -> list[Candidate]:
    """The layouts that fit in `system`'s memory, by predicted tokens/s (fastest first)."""
    found = []
    for tp in _divisors(world, system.per_node or world):
        for pp in _divisors(world // tp, min(MAX_PP, cfg.model.n_layers)):
            # a layer's parameters do not depend on cp: one plan of the stages serves every cp
            base = _with(cfg, tp=tp, pp=pp, cp=1, dp=0, dp_sharding="fsdp", dp_shard=0)
            try:
                _, stages = plan(base, world)
            except ConfigError:  # a tp the heads do not allow
                continue
            for cp in _divisors(world // (tp * pp), world):
                found += _variants(cfg, world, system, tp, pp, cp, stages)
    return sorted(found, key=_rank)


TIE_RULE = (
    "equal predictions are ordered by: least model parallelism (tp x pp x cp), then least traffic "
    "issued per step (hidden or not: HSDP's within-node shards before a world-wide fsdp), then no "
    "recompute, then least memory"
)


def _rank(c: Candidate) -> tuple[float, int, float, bool, float]:
    """Fastest first; among equal predictions (TIE_RULE) what the model does not price: the smaller
    matrices of more model parallelism lose efficiency, traffic it counts as hidden may not be,
    and a recompute policy is a feature the run need not carry."""
    lay = c.layout
    return (-c.step.tokens_per_s, lay.tp * lay.pp * lay.cp, c.step.issued_comm_s, lay.recompute != "none", c.memory_gib)


def _variants(
    cfg: RunConfig, world: int, system: System, tp: int, pp: int, cp: int, stages: list[StagePlan]
) -> list[Candidate]:
    dp = world // (tp * pp * cp)
    if cfg.train.global_batch % dp:
        return []
    found = []
    per_rank = cfg.train.global_batch // dp
    # one rank per replica and no cp: no data parallelism to pick (FSDP2 shards over dp x cp)
    for sharding in SHARDINGS if dp * cp > 1 else ("ddp",):
        shard = _hsdp_shard(system, tp, dp) if sharding == "hsdp" else dp
        if shard is None:
            continue
        # a pipeline needs at least pp micro-batches per step (hlat.config.run refuses fewer)
        for micro in (m for m in (1, 2, 4, 8, 16, 32) if not per_rank % m and per_rank // m >= pp):
            for recompute in choices(ParallelConfig, "activation_checkpoint"):
                variant = _with(
                    cfg,
                    micro_batch=micro,
                    tp=tp,
                    pp=pp,
                    cp=cp,
                    dp_sharding="fsdp" if sharding == "hsdp" else sharding,
                    dp_shard=shard if sharding == "hsdp" else 0,
                    activation_checkpoint=recompute,
                    recompute_every_other_mm=False,
                )
                try:
                    degrees = resolve_degrees(variant.parallel, world)
                    check_data_parallel(variant.parallel.dp_sharding, degrees)
                    check_context_parallel(degrees, variant.parallel.dp_sharding, cfg.data.seq_len)
                    check_grad_accum(variant.precision, variant.parallel.dp_sharding, degrees.dp_cp)
                except ConfigError:
                    continue
                need = (
                    max(
                        stage_memory(
                            variant, s.stage, s.layers, s.local_params, degrees, len(stages), s.muon_params
                        ).total
                        for s in stages
                    )
                    / GIB
                )
                if need <= system.memory_gib:
                    layout = LayoutChoice(
                        tp=tp,
                        pp=pp,
                        dp=dp,
                        sharding=variant.parallel.dp_sharding,
                        dp_shard=shard,
                        micro_batch=micro,
                        recompute=recompute,
                        cp=cp,
                    )
                    found.append(Candidate(layout, need, step_time(variant, world, system, layout)))
    return found


def _hsdp_shard(system: System, tp: int, dp: int) -> int | None:
    """HSDP shards over the data-parallel ranks of one node; None where that is all of dp or one."""
    shard = (system.per_node or 0) // tp
    return shard if 1 < shard < dp and not dp % shard else None


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if not n % d and (d & (d - 1)) == 0]  # powers of two


def _with(cfg: RunConfig, micro_batch: int | None = None, **parallel: object) -> RunConfig:
    out = copy.copy(cfg)  # planning reads the rest: sections it does not replace are shared
    out.parallel = dataclasses.replace(out.parallel, **parallel)
    if micro_batch is not None:
        out.train = dataclasses.replace(out.train, micro_batch=micro_batch)
    return out


def overrides(layout: LayoutChoice) -> list[str]:
    """The command-line overrides that give a config `layout`."""
    return [
        *("--parallel.tp", str(layout.tp), "--parallel.pp", str(layout.pp), "--parallel.cp", str(layout.cp)),
        *("--parallel.dp_sharding", layout.sharding),
        *("--parallel.dp_shard", str(layout.dp_shard if layout.dp_shard < layout.dp else 0)),
        *("--train.micro_batch", str(layout.micro_batch)),
        *("--parallel.activation_checkpoint", layout.recompute, "--parallel.recompute_every_other_mm", "false"),
    ]


def compare_with_own(found: list[Candidate], own: StepTime, own_fits: bool) -> str:
    """What the search says of the config's own layout: whether a faster one fits, and its overrides."""
    if not found:
        return "no layout fits: the config's does not either" if not own_fits else "the search found no layout"
    best = found[0]
    gain = best.step.tokens_per_s / own.tokens_per_s - 1
    to_use = (
        f"{best.layout.name}, micro-batch {best.layout.micro_batch}, recompute {best.layout.recompute}: "
        + " ".join(overrides(best.layout))
    )
    if not own_fits:
        return f"the config's layout does NOT fit; the fastest that does is {to_use}"
    if gain > 0.005:
        return f"a layout {gain:.0%} faster than the config's fits: {to_use}"
    return "no layout that fits is faster than the config's (by more than 0.5%)"


def format_search(found: list[Candidate], top: int, budget_tokens: float, price: float, nodes: int) -> str:
    """The top `top` layouts as a table: memory, step split, tokens/s, MFU, days (and cost)."""
    if not found:
        return "no layout fits in memory: add ranks, or a device with more memory"
    width = max(26, *(len(c.layout.name) for c in found[:top]))  # names with cp run longer
    head = (
        f"{'#':>3} {'layout':<{width}} {'micro':>5} {'recompute':<9} {'GiB':>6} {'step s':>8} {'compute':>8} "
        f"{'comm':>7} {'bubble':>7} {'tokens/s':>12} {'MFU':>6} {'days':>7}"
    )
    lines = [head + ("       cost" if price else "")]
    for index, c in enumerate(found[:top], 1):
        s = c.step
        days, cost = days_and_cost(s.tokens_per_s, budget_tokens, nodes, price)
        line = (
            f"{index:>3} {c.layout.name:<{width}} {c.layout.micro_batch:>5} {c.layout.recompute:<9} {c.memory_gib:>6.1f} "
            f"{s.total_s:>8.2f} {s.compute_s:>8.2f} {s.tp_s + s.cp_s + s.dp_s + s.pp_s:>7.2f} {s.bubble_s:>7.2f} "
            f"{s.tokens_per_s:>12,.0f} {s.mfu:>6.1%} {days:>7.3g}"
        )
        lines.append(line + (f" {cost:>10,.0f}" if price else ""))
    lines.append(
        f"{len(found)} layouts fit; comm = tensor parallel + context-parallel ring + exposed data parallel + pipeline sends"
    )
    tied = sum(c.step.tokens_per_s == found[0].step.tokens_per_s for c in found)
    if tied > 1:
        lines.append(f"{tied} layouts tie for the fastest prediction; {TIE_RULE}")
    return "\n".join(lines)
