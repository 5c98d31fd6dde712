"""How a run is laid out over devices: one DeviceMesh with dims (pp, dp, cp, tp), dp split into
(dp_replicate, dp_shard) under HSDP."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hlat.config.fields import choice_problems


@dataclass
class ParallelConfig:
    """`[parallel]`: the degrees of tensor, pipeline, data and context parallelism, and how data
    parallelism shards, recomputes and compiles."""

    tp: int = 1
    """Tensor (+ sequence) parallel degree: the innermost mesh dim."""
    pp: int = 1
    """Pipeline stages over ranks: the outermost mesh dim."""
    dp: int = 0
    """Data-parallel degree; 0 = the rest of the world size."""
    cp: int = 1
    """Context-parallel degree: each sequence split over this many ranks, attention as ring
    attention (docs/parallelism.md); data.seq_len must be a multiple of 2 x cp."""
    dp_sharding: Literal["ddp", "zero1", "zero2", "fsdp"] = "ddp"
    """How data parallelism shards. "ddp": replicated weights, all-reduced grads. "zero1": +
    optimizer state sharded (ZeroRedundancyOptimizer; 1-D data parallel only). "zero2": FSDP2
    without resharding after forward (weights gathered once per step; grads and optimizer state
    sharded). "fsdp": FSDP2 (ZeRO-3), weights re-gathered for backward."""
    dp_shard: int = 0
    """zero2/fsdp only: ranks each weight is sharded over; 0 = all of dp (plain FSDP). A divisor
    of dp (the GPUs of a node, say) gives HSDP: dp / dp_shard replicas, each sharded over dp_shard
    ranks, gradients all-reduced across replicas (docs/parallelism.md)."""
    reshard_after_backward: bool = True
    """zero2/fsdp with gradient accumulation: true = reshard (free) the gathered weights after each
    micro-batch's backward and gather them again for the next (least memory); false = keep them
    gathered until the step's last backward (one gather per step under zero2; costs the unsharded
    weights between micro-batches). Pipeline schedules always keep them (torch's)."""
    device_layout: Literal["auto", "config"] = "auto"
    """"auto": on devices whose compiled blocks do not take tensor parallelism (CUDA GPUs:
    docs/parallelism.md), a model of at most 9B parameters whose tp > 1 came from its preset (not
    from a config file or the command line) runs tp 1, FSDP2 (or HSDP under dp_shard) over all the
    ranks, where the memory plan fits the device; the start-up log says so. "config": the layout
    as configured."""
    pp_schedule: Literal["1f1b", "interleaved-1f1b", "gpipe"] = "1f1b"
    """The pipeline schedule (torch.distributed.pipelining): 1F1B, its interleaved form over
    pp_stages_per_rank virtual stages, or GPipe (all forwards, then all backwards)."""
    pp_stages_per_rank: int = 1
    """Virtual pipeline stages per rank; > 1 for interleaved 1F1B."""
    activation_checkpoint: Literal["none", "selective", "op", "full"] = "none"
    """The recompute policy (docs/parallelism.md). "selective" = HLAT's core attention + SwiGLU
    recompute; "op" = save matmul and attention outputs, recompute the pointwise rest (GPUs);
    "full" = each block from its input."""
    recompute_attention: Literal["auto", "true", "false"] = field(default="auto", metadata={"accepts_bool": True})
    """With activation_checkpoint "selective": whether backward replays fused attention (SDPA's
    kernels, FlexAttention) or reads its saved output. "auto" = the device's choice (saved on CUDA
    GPUs, where the kernel is the block's costliest to replay and its output small; replayed
    elsewhere, as HLAT did); true/false."""
    recompute_every_other_mm: bool = False
    """With activation_checkpoint "op" only: save every other matmul's output, recompute the rest."""
    compile: Literal["auto", "true", "false"] = field(default="auto", metadata={"accepts_bool": True})
    """torch.compile each transformer block. "auto" = wherever the device has a compile backend
    (inductor on CPU, CUDA, XPU; TorchNeuron's on Trainium: docs/devices.md), checked by a start-up
    probe that falls back to eager; true/false (TOML or command-line booleans too)."""
    compile_mode: Literal["default", "max-autotune-no-cudagraphs"] = "default"
    """torch.compile's mode for the blocks (inductor only). "max-autotune-no-cudagraphs": inductor
    benchmarks Triton and library GEMM kernels for each matmul shape and keeps the fastest
    (minutes more at start-up, no CUDA graphs); "default": its heuristics."""

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        for name in ("tp", "pp", "cp", "pp_stages_per_rank"):
            if getattr(self, name) < 1:
                problems.append((name, f"must be >= 1, got {getattr(self, name)}"))
        if self.dp < 0:
            problems.append(("dp", f"must be >= 0 (0 = inferred from the world size), got {self.dp}"))
        if self.dp_shard < 0:
            problems.append(("dp_shard", f"must be >= 0 (0 = all of dp), got {self.dp_shard}"))
        elif self.dp_shard and self.dp_sharding in ("ddp", "zero1"):
            problems.append(
                (
                    "dp_shard",
                    f"applies to dp_sharding zero2 or fsdp (sharded weights), not {self.dp_sharding}; "
                    "set --parallel.dp_sharding fsdp (or zero2) for HSDP, or --parallel.dp_shard 0",
                )
            )
        problems += choice_problems(
            self,
            "compile",
            "compile_mode",
            "device_layout",
            "dp_sharding",
            "pp_schedule",
            "activation_checkpoint",
            "recompute_attention",
        )
        if self.recompute_attention != "auto" and self.activation_checkpoint != "selective":
            problems.append(
                (
                    "recompute_attention",
                    f"applies to activation_checkpoint = 'selective' only, got {self.activation_checkpoint!r}; "
                    "set --parallel.activation_checkpoint selective or --parallel.recompute_attention auto",
                )
            )
        if self.recompute_every_other_mm and self.activation_checkpoint != "op":
            problems.append(
                (
                    "recompute_every_other_mm",
                    f"applies to activation_checkpoint = 'op' only, got {self.activation_checkpoint!r}; "
                    "set --parallel.activation_checkpoint op or --parallel.recompute_every_other_mm false",
                )
            )
        if self.pp_schedule == "interleaved-1f1b" and self.pp_stages_per_rank < 2:
            problems.append(
                (
                    "pp_stages_per_rank",
                    "interleaved-1f1b needs at least 2 virtual stages per rank; set --parallel.pp_stages_per_rank 2",
                )
            )
        if self.pp_schedule != "interleaved-1f1b" and self.pp_stages_per_rank > 1:
            problems.append(
                (
                    "pp_schedule",
                    f"{self.pp_stages_per_rank} stages per rank need --parallel.pp_schedule interleaved-1f1b",
                )
            )
        return problems
