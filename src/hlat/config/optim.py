"""Optimizer and learning-rate schedule settings (defaults: the HLAT 7B recipe)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hlat.config.fields import choice_problems


@dataclass
class OptimConfig:
    """`[optim]`: the optimizer (AdamW, or Muon beside it), its settings and gradient clipping."""

    name: Literal["adamw", "muon"] = "adamw"
    """"adamw": AdamW on every parameter (HLAT's). "muon": Muon on the blocks' hidden matrices
    (attention and feed-forward projections), AdamW with the settings below on the embeddings,
    output head and norms (docs/recipe.md, "Muon")."""
    lr: float = 3e-4
    """The peak learning rate, reached at the end of warmup (the schedule scales it)."""
    beta1: float = 0.9
    """AdamW's decay rate of the gradient's running mean."""
    beta2: float = 0.95
    """AdamW's decay rate of the squared gradient's running mean."""
    eps: float = 1e-8
    """AdamW's epsilon, added to the denominator's square root."""
    weight_decay: float = 0.1
    """AdamW's decoupled weight decay (multiplied by the learning rate)."""
    weight_decay_scope: Literal["matrices", "all"] = "matrices"
    """Which parameters decay. "matrices": the usual exclusion of norms and embeddings; "all": decay
    every parameter, which is what the HLAT reference scripts effectively did (their exclusion list
    matched no name)."""
    grad_clip: float = 1.0
    """Clip the gradients' global L2 norm to this; 0 disables clipping."""
    muon_momentum: float = 0.95
    """Muon's momentum (torch.optim.Muon's default)."""
    muon_nesterov: bool = True
    """Muon's Nesterov momentum."""
    muon_ns_steps: int = 5
    """Newton-Schulz iterations that orthogonalise each matrix's update."""
    muon_ns_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """The Newton-Schulz iterations' dtype. bfloat16 is torch.optim.Muon's; float32 makes layouts agree to
    fp32 rounding (bf16 turns their 1e-7 differences into roundings that flip) and is the faster one on a
    CPU without bf16 units (AVX512-BF16/AMX), which emulates bf16 matmuls."""
    muon_adjust_lr: Literal["match_rms_adamw", "original"] = "match_rms_adamw"
    """Each matrix's learning rate. "match_rms_adamw": lr x 0.2 x sqrt(max(rows, columns)), which gives
    the update AdamW's RMS so that optim.lr, the schedule and weight_decay carry over from AdamW
    (Moonshot's rule); "original": lr x sqrt(max(1, rows / columns)), which wants a ~50x larger rate
    (set muon_lr_scale)."""
    muon_lr_scale: float = 1.0
    """Multiplies the scheduled learning rate for the Muon matrices only (weight decay included)."""

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        if self.lr <= 0:
            problems.append(("lr", f"must be > 0, got {self.lr}"))
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                problems.append((name, f"must be in [0, 1), got {value}"))
        if self.eps <= 0:
            problems.append(("eps", f"must be > 0, got {self.eps}"))
        if self.weight_decay < 0:
            problems.append(("weight_decay", f"must be >= 0, got {self.weight_decay}"))
        problems += choice_problems(self, "weight_decay_scope")
        if self.grad_clip < 0:
            problems.append(("grad_clip", f"must be >= 0 (0 disables clipping), got {self.grad_clip}"))
        problems += choice_problems(self, "name", "muon_ns_dtype", "muon_adjust_lr")
        if not 0.0 <= self.muon_momentum < 1.0:
            problems.append(("muon_momentum", f"must be in [0, 1), got {self.muon_momentum}"))
        if self.muon_ns_steps < 1:
            problems.append(("muon_ns_steps", f"must be >= 1, got {self.muon_ns_steps}"))
        if self.muon_lr_scale <= 0:
            problems.append(("muon_lr_scale", f"must be > 0, got {self.muon_lr_scale}"))
        return problems


@dataclass
class ScheduleConfig:
    """`[schedule]`: the learning-rate schedule, a multiplier of optim.lr per step."""

    name: Literal["hlat-cosine", "cosine", "wsd", "constant"] = "hlat-cosine"
    """The schedule's shape after warmup. "hlat-cosine": HLAT's exact multiplier, a cosine clamped
    at the floor (not rescaled); "cosine": cosine rescaled to end at the floor; "wsd":
    warmup-stable-decay (linear decay); "constant": warmup then flat."""
    warmup_steps: int = 2000
    """Steps of linear warmup to the peak learning rate: step 1 runs at peak / warmup_steps."""
    decay_steps: int = 500_000
    """The step at which the cosine reaches its floor."""
    min_lr_ratio: float = 0.1
    """The floor as a fraction of the peak learning rate."""
    wsd_decay_fraction: float = 0.2
    """wsd only: the share of decay_steps spent in the final linear decay."""

    def validate(self) -> list[tuple[str, str]]:
        problems = choice_problems(self, "name")
        if self.warmup_steps < 0:
            problems.append(("warmup_steps", f"must be >= 0, got {self.warmup_steps}"))
        if self.decay_steps <= self.warmup_steps and self.name != "constant":
            problems.append(("decay_steps", f"must exceed warmup_steps={self.warmup_steps}, got {self.decay_steps}"))
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            problems.append(("min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}"))
        if not 0.0 < self.wsd_decay_fraction <= 1.0:
            problems.append(("wsd_decay_fraction", f"must be in (0, 1], got {self.wsd_decay_fraction}"))
        return problems
