"""Muon on the blocks' hidden matrices and AdamW on the rest, as one optimizer, on any layout.

Muon (torch.optim.Muon's algorithm: Nesterov momentum, then a Newton-Schulz orthogonalisation of
the whole matrix) needs each matrix whole where it is orthogonalised, while FSDP2, HSDP and tensor
parallelism leave each rank a shard. The matrices of one shape and layout are stacked and
redistributed so that each rank holds whole matrices of the stack, a share of them (DTensor's
shard-to-shard redistribution: an all-to-all); each rank orthogonalises its own and the results
go back to the parameters' layout the same way. Under DDP every rank holds every matrix: each
orthogonalises its share and broadcasts it. Under ZeRO-1 each rank steps only the whole
parameters of its partition. The momentum, weight decay and update are elementwise and run on
each rank's shards, like hlat's AdamW (hlat.optim.adamw); BF16MuonAdamW does the same for bf16
weights, rounding each update as hlat.optim.bf16_adamw rounds AdamW's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.placement_types import Placement, _StridedShard

from hlat.config.optim import OptimConfig
from hlat.dtensor import local_tensor, settled_grad
from hlat.optim.adamw import ShardwiseAdamW, adamw_class, decay_groups
from hlat.optim.bf16_adamw import BF16AdamW, noise_seed, shard_position
from hlat.optim.stochastic_round import int32_seed, random_bits, round_to_bf16
from hlat.parallel.init import canonical_name

# torch.optim.Muon's quintic Newton-Schulz coefficients and norm floor
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


def is_hidden_matrix(name: str, param: Tensor) -> bool:
    """A 2-D weight inside a transformer block: attention and feed-forward projections."""
    return param.ndim == 2 and canonical_name(name).startswith("layers.")


def muon_groups(model: nn.Module, cfg: OptimConfig) -> list[dict]:
    """One Muon group (the hidden matrices, decayed) and AdamW's groups for the rest (embeddings,
    output head, norms), decayed as optim.weight_decay_scope says."""
    hidden = [p for n, p in model.named_parameters() if p.requires_grad and is_hidden_matrix(n, p)]
    chosen = {id(p) for p in hidden}
    rest = []
    for group in decay_groups(model, cfg):
        params = [p for p in group["params"] if id(p) not in chosen]
        if params:
            rest.append({**group, "params": params, "muon": False})
    return [{"params": hidden, "weight_decay": cfg.weight_decay, "muon": True}, *rest]


def newton_schulz(matrix: Tensor, steps: int, dtype: torch.dtype) -> Tensor:
    """torch.optim.Muon's orthogonalisation of a 2-D matrix, computed in `dtype` (torch's: bfloat16)."""
    a, b, c = NS_COEFFICIENTS
    x = matrix.to(dtype)
    tall = matrix.size(0) > matrix.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=NS_EPS)  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def adjusted_lr(lr: float, how: str, shape: torch.Size) -> float:
    """torch.optim.Muon's per-matrix learning rate: "match_rms_adamw" scales the update to AdamW's RMS
    (Moonshot's rule, so AdamW's learning rate and weight decay carry over); "original" is Keller
    Jordan's sqrt(max(1, rows / columns))."""
    rows, cols = shape[:2]
    return lr * (0.2 * math.sqrt(max(rows, cols)) if how == "match_rms_adamw" else math.sqrt(max(1, rows / cols)))


def _stacked(placement: Placement) -> Placement:
    """`placement` of a matrix, for a stack of such matrices (one more leading dim)."""
    if isinstance(placement, _StridedShard):
        return _StridedShard(placement.dim + 1, split_factor=placement.split_factor)
    if isinstance(placement, Shard):
        return Shard(placement.dim + 1)
    return placement


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


def orthogonalised(
    params: list[Tensor], updates: list[Tensor], steps: int, dtype: torch.dtype, spread_group: dist.ProcessGroup | None
) -> list[Tensor]:
    """Each parameter's local part of its whole update matrix orthogonalised, each matrix on one rank.
    `updates`: the local parts, in the parameters' layouts; `spread_group`: see MuonAdamW."""
    out: list[Tensor | None] = [None] * len(params)
    batches: dict[tuple, list[int]] = defaultdict(list)
    plain = []
    for i, p in enumerate(params):
        if isinstance(p, DTensor):
            batches[(p.device_mesh, tuple(p.placements), tuple(p.shape))].append(i)
        else:
            plain.append(i)
    for (mesh, placements, shape), index in batches.items():
        stacked = tuple(_stacked(pl) for pl in placements)
        size = (len(index), *shape)
        stack = DTensor.from_local(
            torch.stack([updates[i] for i in index]), mesh, stacked, shape=size, stride=_contiguous(size)
        )
        whole = [Shard(0)] * mesh.ndim  # each rank a share of whole matrices
        mine = stack.redistribute(mesh, whole).to_local()
        done = torch.stack([newton_schulz(m, steps, dtype) for m in mine]) if len(mine) else mine
        back = DTensor.from_local(done.to(mine.dtype), mesh, whole, shape=size, stride=_contiguous(size))
        for k, local in zip(index, back.redistribute(mesh, stacked).to_local().unbind(0)):
            out[k] = local
    # whole matrices on every rank of spread_group: rank r orthogonalises every n-th from r, broadcasts it
    ranks = 1 if spread_group is None else dist.get_world_size(spread_group)
    me = 0 if spread_group is None else dist.get_rank(spread_group)
    for n, i in enumerate(plain):
        owner = n % ranks
        # contiguous: a tall matrix's result is a transposed view, which a collective sends in memory order
        ortho = newton_schulz(updates[i], steps, dtype).contiguous() if owner == me else None
        if ranks > 1:
            ortho = ortho if ortho is not None else torch.empty_like(updates[i], dtype=dtype)
            dist.broadcast(ortho, dist.get_global_rank(spread_group, owner), group=spread_group)
        out[i] = ortho
    return out  # type: ignore[return-value]


class _MuonSteps:
    """Muon on the param groups marked `muon`, beside an AdamW class (the next base) that steps the
    others as it always does: its kernel, its state, its skip on `found_inf`. A subclass writes
    one group's Muon update (`_muon_step`). `spread_group`: the data-parallel group whose ranks
    hold every plain (not DTensor) matrix alike (DDP), which share out their orthogonalisation;
    None where each rank steps its own."""

    def __init__(
        self,
        params: list[dict],
        *,
        momentum: float,
        nesterov: bool,
        ns_steps: int,
        ns_dtype: str,
        adjust_lr: str,
        lr_scale: float,
        spread_group: dist.ProcessGroup | None = None,
        **adamw: Any,
    ):
        super().__init__(params, **adamw)  # type: ignore[call-arg]
        muon = dict(
            momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, ns_dtype=ns_dtype, adjust_lr=adjust_lr,
            lr_scale=lr_scale, muon=False,
        )  # fmt: skip
        self.defaults.update(muon)  # type: ignore[attr-defined]
        for group in self.param_groups:  # type: ignore[attr-defined]
            for key, value in muon.items():
                group.setdefault(key, value)
        self.spread_group = spread_group

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        groups = self.param_groups  # type: ignore[has-type]
        self.param_groups = [g for g in groups if not g["muon"]]  # AdamW's, as its class steps them
        try:
            super().step()  # type: ignore[misc]
        finally:
            self.param_groups = groups
        for group in groups:
            if group["muon"]:
                params = [p for p in group["params"] if p.grad is not None]
                if params:
                    self._muon_step(group, params)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A loaded state_dict: the AdamW class fixes up its own groups (torch's Adam expects a
        `step` in every parameter's state; Muon's hold a momentum only)."""
        groups = state["param_groups"]
        super().__setstate__({**state, "param_groups": [g for g in groups if not g["muon"]]})  # type: ignore[misc]
        self.param_groups = groups

    def _muon_step(self, group: dict[str, Any], params: list[Tensor]) -> None:
        raise NotImplementedError

    def _orthogonalised(self, group: dict[str, Any], params: list[Tensor], updates: list[Tensor]) -> list[Tensor]:
        return orthogonalised(params, updates, group["ns_steps"], getattr(torch, group["ns_dtype"]), self.spread_group)


class MuonAdamW(_MuonSteps, ShardwiseAdamW):
    """Muon for the groups marked `muon`, torch's AdamW (hlat's ShardwiseAdamW) for the others.
    `found_inf` (a 0-d device tensor, 1 = skip), set where AdamW is fused, leaves every weight and
    state as it was."""

    def _muon_step(self, group: dict[str, Any], params: list[Tensor]) -> None:
        momentum, lr = group["momentum"], group["lr"] * group["lr_scale"]
        updates = []
        for p in params:
            grad = local_tensor(settled_grad(p))
            buf = local_tensor(self.state[p].setdefault("momentum_buffer", torch.zeros_like(p)))
            new_buf = buf.lerp(grad, 1 - momentum)
            updates.append(grad.lerp(new_buf, momentum) if group["nesterov"] else new_buf)
            self._commit(buf, new_buf)
        for p, ortho in zip(params, self._orthogonalised(group, params, updates)):
            weights = local_tensor(p)
            new = weights.mul(1 - lr * group["weight_decay"])
            new.add_(ortho, alpha=-adjusted_lr(lr, group["adjust_lr"], p.shape))
            self._commit(weights, new)

    def _commit(self, target: Tensor, new: Tensor) -> None:
        """target <- new, unless found_inf says to skip this step (no host sync)."""
        found_inf = getattr(self, "found_inf", None)
        target.copy_(new if found_inf is None else torch.where(found_inf.bool(), target, new))


class BF16MuonAdamW(_MuonSteps, BF16AdamW):
    """MuonAdamW for bf16 parameters (precision.mode bf16-sr, bf16): BF16AdamW on the groups not
    marked `muon`; on the Muon matrices the momentum and the weights are computed in fp32 from
    their bf16 values and rounded back as BF16AdamW rounds its first moment and weights
    (stochastically under bf16-sr, with noise keyed by the run's seed, the step, the parameter's
    name and each element's global index). Skips exactly on `found_inf` as BF16AdamW does."""

    def _muon_step(self, group: dict[str, Any], params: list[Tensor]) -> None:
        group["calls"] += 1  # keys the rounding noise, as BF16AdamW counts its groups' calls
        momentum, lr = group["momentum"], group["lr"] * group["lr_scale"]
        found_inf: Tensor | None = getattr(self, "found_inf", None)
        stochastic = group["rounding"] == "stochastic"
        updates, noises = [], []
        for i, p in enumerate(params):
            grad = local_tensor(settled_grad(p)).float()
            buf = local_tensor(self.state[p].setdefault("momentum_buffer", torch.zeros_like(p)))
            new_buf = buf.float().lerp(grad, 1 - momentum)
            updates.append(grad.lerp(new_buf, momentum) if group["nesterov"] else new_buf)
            offset, salt = shard_position(p)
            seed = int32_seed(noise_seed(group["seed"], group["calls"], self.names.get(id(p), f"muon.{i}"), salt))
            noise_p, noise_m = random_bits(buf.numel(), offset, seed, buf.device) if stochastic else (None, None)
            _round_into(buf, new_buf, noise_m, found_inf)
            noises.append(noise_p)
        for p, ortho, noise in zip(params, self._orthogonalised(group, params, updates), noises):
            weights = local_tensor(p)
            new = (
                weights.float() * (1 - lr * group["weight_decay"])
                - adjusted_lr(lr, group["adjust_lr"], p.shape) * ortho.float()
            )
            _round_into(weights, new, noise, found_inf)


def _round_into(target: Tensor, value: Tensor, noise: Tensor | None, found_inf: Tensor | None) -> None:
    """bf16 `target` <- fp32 `value` rounded (stochastically with `noise`, flat), unless found_inf is set."""
    rounded = round_to_bf16(value.reshape(-1), noise).view_as(target)
    target.copy_(rounded if found_inf is None else torch.where(found_inf.to(target.device) != 0, target, rounded))


def muon_class(
    cfg: OptimConfig,
    bf16_rounding: str | None = None,
    seed: int = 0,
    compile: bool = True,
    device_type: str = "cpu",
    model: nn.Module | None = None,
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """(optimizer class, its hyperparameters) for optim.name muon, as hlat.optim.adamw.adamw_class
    gives AdamW's (what ZeroRedundancyOptimizer takes; each becomes a param-group entry, saved with
    the optimizer's state): MuonAdamW for fp32 parameters, BF16MuonAdamW for bf16 ones."""
    muon = dict(
        momentum=cfg.muon_momentum, nesterov=cfg.muon_nesterov, ns_steps=cfg.muon_ns_steps,
        ns_dtype=cfg.muon_ns_dtype, adjust_lr=cfg.muon_adjust_lr, lr_scale=cfg.muon_lr_scale,
    )  # fmt: skip
    cls, adamw = adamw_class(cfg, bf16_rounding, seed, compile, device_type, model)
    return (BF16MuonAdamW if cls is BF16AdamW else MuonAdamW), {**adamw, **muon}
