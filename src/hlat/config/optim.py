"""Optimizer and learning-rate schedule settings (defaults: the HLAT 7B recipe)."""

from __future__ import annotations

from dataclasses import dataclass

WEIGHT_DECAY_SCOPES = ("matrices", "all")
SCHEDULES = ("hlat-cosine", "cosine", "wsd", "constant")


@dataclass
class OptimConfig:
    lr: float = 3e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    # "matrices": the usual exclusion of norms and embeddings; "all": decay every parameter, which
    # is what the HLAT reference scripts effectively did (their exclusion list matched no name).
    weight_decay_scope: str = "matrices"
    grad_clip: float = 1.0  # global L2 norm; 0 disables clipping

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
        if self.weight_decay_scope not in WEIGHT_DECAY_SCOPES:
            problems.append(("weight_decay_scope", f"got {self.weight_decay_scope!r}; choose one of {', '.join(WEIGHT_DECAY_SCOPES)}"))
        if self.grad_clip < 0:
            problems.append(("grad_clip", f"must be >= 0 (0 disables clipping), got {self.grad_clip}"))
        return problems


@dataclass
class ScheduleConfig:
    # "hlat-cosine": HLAT's exact multiplier, a cosine clamped at the floor (not rescaled);
    # "cosine": cosine rescaled to end at the floor; "wsd": warmup-stable-decay (linear decay);
    # "constant": warmup then flat.
    name: str = "hlat-cosine"
    warmup_steps: int = 2000
    decay_steps: int = 500_000  # step at which the cosine reaches its floor
    min_lr_ratio: float = 0.1  # floor as a fraction of the peak LR
    wsd_decay_fraction: float = 0.2  # wsd: share of decay_steps spent in the final linear decay

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        if self.name not in SCHEDULES:
            problems.append(("name", f"got {self.name!r}; choose one of {', '.join(SCHEDULES)}"))
        if self.warmup_steps < 0:
            problems.append(("warmup_steps", f"must be >= 0, got {self.warmup_steps}"))
        if self.decay_steps <= self.warmup_steps and self.name != "constant":
            problems.append(("decay_steps", f"must exceed warmup_steps={self.warmup_steps}, got {self.decay_steps}"))
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            problems.append(("min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}"))
        if not 0.0 < self.wsd_decay_fraction <= 1.0:
            problems.append(("wsd_decay_fraction", f"must be in (0, 1], got {self.wsd_decay_fraction}"))
        return problems
