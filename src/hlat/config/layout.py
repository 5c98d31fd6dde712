"""The layout's degrees and the rules a layout must follow, as functions of the configuration alone,
so that load_config(world=...) checks them before any process group exists and the builders
(hlat.parallel) and the planner (hlat.planning) apply the same rules."""

from __future__ import annotations

from dataclasses import dataclass

from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.errors import ConfigError


@dataclass(frozen=True)
class Degrees:
    """How many ranks each mesh dim spans, outermost first: pp x dp_replicate x dp_shard x cp x tp.
    dp = dp_replicate x dp_shard is the data-parallel degree (HSDP when dp_replicate > 1)."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def dp_cp(self) -> int:
        """The ranks gradients are averaged over: data parallel, and context parallel's ranks,
        each of which computes the gradient of its own part of the sequences."""
        return self.dp * self.cp

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    def summary(self) -> str:
        """As the logs print them: pp 1 x dp 4 x tp 2, or under HSDP pp 1 x dp 4 (2 replicas x 2 shards) x tp 2."""
        hsdp = f" ({self.dp_replicate} replicas x {self.dp_shard} shards)" if self.dp_replicate > 1 else ""
        cp = f" x cp {self.cp}" if self.cp > 1 else ""
        return f"pp {self.pp} x dp {self.dp}{hsdp}{cp} x tp {self.tp}"


def resolve_degrees(cfg: ParallelConfig, world: int) -> Degrees:
    """The degrees for this world size, or a ConfigError naming the field and the fix. dp_shard is
    parallel.dp_shard, or all of dp when it is 0 (plain FSDP, and ddp/zero1's one replica)."""
    inner = cfg.tp * cfg.pp * cfg.cp
    cp = f" x cp={cfg.cp}" if cfg.cp > 1 else ""
    if world % inner:
        raise ConfigError(
            [
                (
                    "parallel.tp",
                    f"tp={cfg.tp} x pp={cfg.pp}{cp} = {inner} does not divide the world size {world}; launch a multiple of {inner} processes",
                )
            ]
        )
    dp = cfg.dp or world // inner
    if dp * inner != world:
        raise ConfigError(
            [
                (
                    "parallel.dp",
                    f"pp={cfg.pp} x dp={dp}{cp} x tp={cfg.tp} = {dp * inner} processes, but {world} were launched; set --parallel.dp {world // inner} or 0",
                )
            ]
        )
    if cfg.dp_shard and dp % cfg.dp_shard:
        divisors = [d for d in range(1, dp + 1) if not dp % d]
        raise ConfigError(
            [
                (
                    "parallel.dp_shard",
                    f"dp_shard={cfg.dp_shard} does not divide dp={dp} (pp={cfg.pp} x tp={cfg.tp} over {world} "
                    f"processes); choose one of {', '.join(map(str, divisors))} (0 = all of dp)",
                )
            ]
        )
    shard = cfg.dp_shard or dp
    return Degrees(pp=cfg.pp, dp_replicate=dp // shard, dp_shard=shard, cp=cfg.cp, tp=cfg.tp)


def check_tensor_parallel(cfg: ModelConfig, tp: int) -> None:
    problems = []
    if cfg.n_heads % tp:
        problems.append(("parallel.tp", f"tp={tp} does not divide model.n_heads={cfg.n_heads}"))
    if cfg.n_kv_heads % tp and tp % cfg.n_kv_heads:
        problems.append(
            (
                "parallel.tp",
                f"tp={tp} and model.n_kv_heads={cfg.n_kv_heads}: one must divide the other "
                "(KV heads are split over tp ranks, or replicated when there are more ranks than heads)",
            )
        )
    if cfg.ffn_dim % tp:
        problems.append(("model.ffn_dim", f"{cfg.ffn_dim} is not divisible by parallel.tp={tp}"))
    if problems:
        raise ConfigError(problems)


def check_context_parallel(degrees: Degrees, sharding: str, seq_len: int | None = None) -> None:
    """What context parallelism supports: rows that cut into 2*cp equal chunks (causal load
    balancing, hlat.model.ring_attention), without ZeRO-1.
    seq_len None: the data's rules are not asked (the model builder does not know them)."""
    cp = degrees.cp
    if cp == 1:
        return
    problems = []
    if seq_len is not None and seq_len % (2 * cp):
        problems.append(
            (
                "data.seq_len",
                f"{seq_len} does not cut into 2 x parallel.cp={cp} equal chunks; use a multiple of {2 * cp}",
            )
        )
    if sharding == "zero1":
        problems.append(("parallel.dp_sharding", f"zero1 is not supported with cp={cp}; use ddp, zero2 or fsdp"))
    if problems:
        raise ConfigError(problems)


def check_data_parallel(sharding: str, degrees: Degrees) -> None:
    if degrees.dp_cp == 1:
        return
    if sharding == "ddp" and (degrees.tp > 1 or degrees.pp > 1):
        # DDP's reducer supports neither DTensor weights nor the pipeline's split backward passes.
        raise ConfigError(
            [
                (
                    "parallel.dp_sharding",
                    "ddp is 1-D data parallel only; with tp or pp use zero2 (same memory as ddp "
                    "for weights during the step, sharded gradients and optimizer state) or fsdp",
                )
            ]
        )
    if sharding == "zero1" and (degrees.tp > 1 or degrees.pp > 1):
        raise ConfigError(
            [
                (
                    "parallel.dp_sharding",
                    "zero1 (ZeroRedundancyOptimizer) is 1-D data parallel only; with tp or pp use zero2, "
                    "which shards the optimizer state as ZeRO-1 does and the gradients too, at the same communication volume",
                )
            ]
        )


def check_grad_accum(precision: PrecisionConfig, sharding: str, dp: int) -> None:
    if precision.fp32_grad_accum and dp > 1 and sharding in ("ddp", "zero1"):
        # DDP's reducer reads .grad in its own buckets; FSDP2 accumulates in its reduce dtype.
        raise ConfigError(
            [
                (
                    "precision.fp32_grad_accum",
                    f"not supported with dp_sharding {sharding}; use --parallel.dp_sharding "
                    "zero2 (weights whole as under ddp, gradients reduced in fp32) or set it to false",
                )
            ]
        )
