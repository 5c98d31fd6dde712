"""AdamW with the HLAT settings, a choice of which parameters are decayed, and of fp32 or bf16 state."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hlat.config.optim import OptimConfig
from hlat.device.record import device_record
from hlat.dtensor import local_tensor, settled_grad
from hlat.optim.bf16_adamw import BF16AdamW
from hlat.parallel.init import canonical_name


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


class ShardwiseAdamW(torch.optim.AdamW):
    """torch's AdamW (fused or foreach, same kernels, same state) run on each rank's shards.

    AdamW is elementwise, so the shards are all it needs; DTensor would plan the fused kernel's
    lists over the whole mesh first, which on torch 2.13 costs more than a small model's step
    (hlat.parallel.grad_norm says more). The state stays DTensors, so checkpoints are unchanged.
    A gradient in other placements than its parameter's is settled first."""

    def _init_group(self, group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps):  # noqa: ANN001, ANN202
        has_complex = super()._init_group(group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps)
        grads[:] = [local_tensor(settled_grad(p)) for p in params]
        for tensors in (params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs):
            tensors[:] = [local_tensor(t) for t in tensors]
        return has_complex


def adamw_class(
    cfg: OptimConfig,
    bf16_rounding: str | None = None,
    seed: int = 0,
    compile: bool = True,
    device_type: str = "cpu",
    model: nn.Module | None = None,
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """(optimizer class, keyword arguments) without the parameters: what ZeroRedundancyOptimizer takes.

    `bf16_rounding` None: torch AdamW for fp32 state (fused on `device_type`s that have the kernel).
    "stochastic"/"nearest"/"hardware": BF16AdamW for bf16 parameters, rounding each update that way
    (noise seeded by `seed` and by the names of `model`'s parameters; `compile` fuses the update
    where the parameters' device has a compile backend). Both honour `found_inf` (see skips_exactly).
    """
    kwargs: dict[str, Any] = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    if bf16_rounding is None:
        # fused: one kernel over all parameters, and the `found_inf` flag that skips a step exactly
        # on the device; where the device has no such kernel, foreach does the update
        fused = device_record(device_type).fused_adamw
        return ShardwiseAdamW, {**kwargs, "fused": fused, "foreach": not fused}
    names = None if model is None else {id(p): canonical_name(n) for n, p in model.named_parameters()}
    return BF16AdamW, {**kwargs, "rounding": bf16_rounding, "seed": seed, "compile": compile, "names": names}


def build_adamw(
    model: nn.Module, cfg: OptimConfig, bf16_rounding: str | None = None, seed: int = 0, compile: bool = True
) -> torch.optim.Optimizer:
    device_type = next(model.parameters()).device.type
    cls, kwargs = adamw_class(cfg, bf16_rounding, seed, compile, device_type, model)
    return cls(decay_groups(model, cfg), **kwargs)


def skips_exactly(optimizer: torch.optim.Optimizer) -> bool:
    """Whether setting `optimizer.found_inf` (a 0-d device tensor, 1 = skip) makes its step leave
    weights, moments and step counts untouched without a host sync."""
    return isinstance(optimizer, BF16AdamW) or bool(optimizer.defaults.get("fused"))
