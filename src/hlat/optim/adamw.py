"""AdamW with the HLAT settings and a choice of which parameters are decayed."""

from __future__ import annotations

import torch
from torch import nn

from hlat.optim.config import OptimConfig


def decay_groups(model: nn.Module, cfg: OptimConfig) -> list[dict]:
    """Parameter groups for AdamW: with scope "matrices", norms and embeddings are not decayed."""
    if cfg.weight_decay_scope == "all":
        return [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": cfg.weight_decay}]
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        # Norm weights are the only 1-D parameters of a LLaMA (no biases).
        (no_decay if param.ndim < 2 or id(param) in embeddings else decay).append(param)
    return [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_adamw(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    # foreach keeps the step vectorised over all parameters; `fused` is CUDA/CPU-kernel specific
    # and does not compose with DTensor on every backend, so it is not the default.
    return torch.optim.AdamW(
        decay_groups(model, cfg),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        foreach=True,
    )
