"""Learning-rate multipliers as pure functions of the step: nothing to checkpoint but the step."""

from __future__ import annotations

import math

from hlat.config.optim import ScheduleConfig


def lr_multiplier(cfg: ScheduleConfig, step: int) -> float:
    """Multiplier of the peak LR for optimizer step `step` (0-based: the first update is step 0).

    Warmup is linear over warmup_steps updates, the first at 1/warmup_steps of the peak, the last at
    the peak: HLAT's reference ran its first update at LR 0, a step of compute that changed nothing.
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.name == "constant":
        return 1.0
    span = cfg.decay_steps - cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.min_lr_ratio
    if cfg.name == "hlat-cosine":
        # HLAT clamps the plain cosine at the floor instead of rescaling it, so the LR reaches
        # the floor early (at progress ~0.8 for a 10% floor) and stays there.
        return max(floor, 0.5 * (1.0 + math.cos(math.pi * progress)))
    if cfg.name == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    # wsd: hold the peak, then decay linearly to the floor over the last fraction of the span.
    decay_start = 1.0 - cfg.wsd_decay_fraction
    if progress <= decay_start:
        return 1.0
    return 1.0 - (1.0 - floor) * (progress - decay_start) / cfg.wsd_decay_fraction
