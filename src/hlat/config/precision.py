"""The precision mode: storage dtypes, compute dtype, gradient sums (docs/precision.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hlat.config.fields import choice_problems


@dataclass
class PrecisionConfig:
    """`[precision]`: the dtypes weights, gradients and optimizer state are stored and computed in."""

    mode: Literal["fp32", "mixed", "bf16-sr", "bf16"] = "fp32"
    """The precision mode. "fp32": everything fp32. "mixed" (HLAT 70B): compute from a bf16 copy
    of the weights (bf16 autocast), fp32 weights, gradients and Adam state. "bf16-sr" (HLAT 7B):
    weights, gradients and Adam moments in bf16, each update computed in fp32 and stochastically
    rounded back. "bf16": the same rounded to nearest, the baseline that loses small updates. The
    bf16 modes compute in fp32 on CPUs (docs/precision.md)."""
    compile_optimizer: bool = True
    """Fuse the bf16 modes' optimizer update into one kernel with torch.compile (seconds to build
    on the first step). false runs the same arithmetic eagerly, several times slower, for
    platforms without a working compiler."""
    float8: bool = False
    """Run the transformer blocks' linear layers as float8 matmuls (torchao, the `float8` extra;
    CUDA capability >= 8.9 only, refused elsewhere). The output head stays in the mode's dtype."""
    float8_min_d_model: int = 4096
    """With float8: convert only models whose blocks are at least this wide (model.d_model); below
    it the casts and scales cost more than float8 matmuls save (torchao's recipes for Llama 3 8B
    and up), and the run keeps the mode's dtype, saying so at start-up. 0 = every width."""
    bf16_weight_cache: bool = False
    """mixed on one device or DDP: cast each fp32 weight to bf16 once per optimizer step and reuse
    that copy in every micro-batch and recompute of the step, instead of casting it again at each
    use (the copies live until the step's last backward, as one micro-batch's already do). Under
    zero2/fsdp FSDP2 casts as it gathers: --parallel.reshard_after_backward false gathers once per
    step there."""
    reduce_dtype: Literal["fp32", "bf16"] = "fp32"
    """Mixed under zero2/fsdp: the dtype FSDP2 reduce-scatters gradients in and accumulates them in
    across micro-batches ("bf16" halves that traffic and memory). Single-device and DDP mixed
    always accumulate in fp32, the dtype of their gradients."""
    fp32_grad_accum: bool = False
    """bf16 storage modes: accumulate micro-batch gradients in fp32 and round once per step (+4
    bytes/param between micro-batches). false = HLAT's recipe: bf16 gradients summed in bf16."""

    def validate(self) -> list[tuple[str, str]]:
        problems = choice_problems(self, "mode", "reduce_dtype")
        if self.float8_min_d_model < 0:
            problems.append(("float8_min_d_model", f"must be >= 0 (0 = every width), got {self.float8_min_d_model}"))
        if self.bf16_weight_cache and self.mode != "mixed":
            problems.append(
                (
                    "bf16_weight_cache",
                    f"caches mixed's bf16 weight copies; precision.mode {self.mode} has none, set it to false",
                )
            )
        if self.fp32_grad_accum and self.mode in ("fp32", "mixed"):
            problems.append(
                (
                    "fp32_grad_accum",
                    f"{self.mode} already accumulates gradients in fp32; "
                    "the switch is for bf16-sr and bf16, set it to false",
                )
            )
        return problems
