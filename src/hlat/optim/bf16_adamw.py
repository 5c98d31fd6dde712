"""AdamW for parameters, gradients and moments all stored in bf16 (HLAT 7B's precision).

Each update is computed in fp32 from the bf16 values and written back to bf16. Weights and the
first moment are rounded stochastically (Trainium's hardware mode, the one HLAT trained with) or
to nearest (the baseline that shows why stochastic rounding exists: updates smaller than half a
bf16 ulp are lost); the second moment is always rounded to nearest (see adamw_update_).
"hardware" writes every value back with a plain cast, for a device whose hardware rounds casts
stochastically (hlat.device.rounding): the device rounds, hlat adds no noise.

Works on each rank's local shard: DTensor parameters (FSDP2, tensor parallel) are updated
through `.to_local()`, and the class takes plain keyword arguments so ZeroRedundancyOptimizer can
build it. The rounding noise is a function of (seed, step, parameter name, global element
index), so the optimizer's ordinary state_dict (step counts, seed in the param groups) is all a
resume needs, and two copies of one parameter (a tied embedding on the first and the last
pipeline stage, each updated by its stage's optimizer) round alike. Without names (`names`), a
parameter's position across the groups stands in for its name.

A step can be skipped exactly without a host sync, with torch's fused-AdamW protocol: set
`optimizer.found_inf` to a 0-d float tensor on the parameters' device; where it is 1, weights,
moments and the step count are left as they were (the step count lives on the device, and so do
the bias corrections computed from it).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from hlat.device.record import device_record
from hlat.dtensor import local_tensor, settled_grad
from hlat.optim.stochastic_round import MAX_ELEMENTS, int32_seed, random_bits, round_to_bf16

ROUNDINGS = ("stochastic", "nearest", "hardware")


def adamw_update_(
    p: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    skip: torch.Tensor,
    bias1: torch.Tensor,
    bias2_sqrt: torch.Tensor,
    *,
    lr: float | torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    stochastic: bool,
    offset: int | torch.Tensor,
    seed: int | torch.Tensor,
) -> None:
    """One AdamW update of flat bf16 tensors, in fp32, in torch.optim.AdamW's order of operations.

    `bias1`, `bias2_sqrt` (0-d, device): Adam's bias corrections for this update, computed outside
    (a power inside the fused kernel would run per element, +50% time). Where `skip` (0-d, device)
    is nonzero every tensor keeps its value, whatever non-finite numbers the gradient holds.
    `lr`, `offset` and `seed` change between calls: Python numbers for a compiler that takes them
    as dynamic scalars, 0-d device tensors (the seed as int32_seed) for one that specialises on
    every Python number it sees (compiled_update's static form).
    """
    g32 = g.float()
    m32 = m.float().lerp(g32, 1 - beta1)
    v32 = v.float() * beta2 + (1 - beta2) * g32 * g32
    p32 = p.float() * (1 - lr * weight_decay) - (lr / bias1) * m32 / (v32.sqrt() / bias2_sqrt + eps)
    noise_p, noise_m = random_bits(p.numel(), offset, seed, p.device) if stochastic else (None, None)
    keep = skip != 0
    p.copy_(torch.where(keep, p, round_to_bf16(p32, noise_p)))
    m.copy_(torch.where(keep, m, round_to_bf16(m32, noise_m)))
    # The second moment only enters through a square root: rounding it to nearest (as torchao
    # does) errs by at most 0.2% of the update's denominator, and saves a second hash per element.
    v.copy_(torch.where(keep, v, round_to_bf16(v32, None)))


@functools.cache
def compiled_update(backend: str = "inductor", dynamic: bool = True) -> Callable[..., None]:
    """The update fused into one kernel per parameter by torch.compile's `backend` (built on first
    use: importing the compiler costs seconds). Flat inputs; `dynamic`: sizes and scalars symbolic,
    one kernel for all shapes. Without it (a compiler that rejects dynamic shapes, as TorchNeuron's
    does: DeviceRecord.compile_dynamic) one kernel per flat size, the changing scalars passed as
    0-d tensors so that no step's values are baked in."""
    return torch.compile(adamw_update_, dynamic=dynamic, backend=backend)


def _as_tensor(value: int | float, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(value, dtype=dtype).to(device, non_blocking=True)


def shard_position(p: torch.Tensor) -> tuple[int, int]:
    """(global flat index of this rank's first element, salt for the noise seed).

    Row-sharded (Shard(0)) and replicated tensors hold a contiguous range of the full tensor: the
    offset makes their noise identical to the single-device run's. Other layouts (e.g. tensor
    parallel column shards) fold the shard's coordinates into the seed instead: still unbiased and
    independent per shard, but not bit-identical to one device. Replicas share noise either way,
    so DDP/HSDP replicas stay identical.
    """
    if not isinstance(p, DTensor):
        return 0, 0
    _, offsets = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    if all(pl.is_replicate() or type(pl) is Shard and pl.dim == 0 for pl in p.placements):
        return offsets[0] * math.prod(p.shape[1:]), 0
    coords = p.device_mesh.get_coordinate() or []
    sharded = tuple(c for c, pl in zip(coords, p.placements) if not pl.is_replicate())
    return 0, 1 + int.from_bytes(hashlib.blake2b(repr(sharded).encode(), digest_size=4).digest(), "little")


def noise_seed(seed: int, call: int, parameter: str | int, salt: int) -> int:
    """A 32-bit seed per (run seed, step() call, parameter name or position, shard): fresh noise every step."""
    digest = hashlib.blake2b(f"{seed}|{call}|{parameter}|{salt}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


class BF16AdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        rounding: str = "stochastic",
        seed: int = 0,
        compile: bool = True,
        names: Mapping[int, str] | None = None,
    ) -> None:
        """`names`: id(parameter) -> its name, which keys its rounding noise (adamw_class builds it
        from the model); a parameter without one is keyed by its position across the groups."""
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
        # rounding and seed live in the param groups so that they travel with the state_dict.
        # `calls` counts step() calls, skipped ones included: it keys the rounding noise on the host.
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, rounding=rounding, seed=seed, calls=0)
        super().__init__(params, defaults)
        first = next((p for group in self.param_groups for p in group["params"]), None)
        record = device_record(first.device.type) if first is not None else None
        backend = record.compile_backend if compile and record is not None else None
        # eager where nothing compiles; static: one kernel per distinct flat size, and room for them
        self.static = backend is not None and not record.compile_dynamic  # type: ignore[union-attr]
        self.update = compiled_update(backend, not self.static) if backend else adamw_update_
        sizes = {local_tensor(p).numel() for group in self.param_groups for p in group["params"]}
        # static: room for a kernel per size (dynamo falls back to eager past its recompile limit)
        self.recompile_limit = max(torch._dynamo.config.recompile_limit, len(sizes)) if self.static else None
        self.names = dict(names or {})
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype != torch.bfloat16:
                    raise TypeError(
                        f"BF16AdamW updates bf16 parameters, got a {p.dtype} one of shape {tuple(p.shape)}; "
                        "cast the model with hlat.precision.cast_parameters first"
                    )
                if p.numel() >= MAX_ELEMENTS:
                    raise ValueError(f"a parameter of {p.numel():,} elements exceeds the 2^31 of the rounding counter")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf: torch.Tensor | None = getattr(self, "found_inf", None)
        skips: dict[torch.device, torch.Tensor] = {}  # found_inf (or no skip) on each parameter device
        position = 0  # without a name: the position across groups, the same on every data-parallel replica
        room = (
            torch._dynamo.config.patch(recompile_limit=self.recompile_limit)
            if self.recompile_limit
            else contextlib.nullcontext()
        )
        with room:
            for group in self.param_groups:
                beta1, beta2 = group["betas"]
                group["calls"] += 1
                for p in group["params"]:
                    position += 1
                    if p.grad is None:
                        continue
                    local = local_tensor(p)
                    skip = skips.get(local.device)
                    if skip is None:
                        skip = skips[local.device] = (
                            torch.zeros((), device=local.device)
                            if found_inf is None
                            else found_inf.to(local.device, torch.float32, non_blocking=True)
                        )
                    state = self.state[p]
                    if not state:
                        state["step"] = torch.zeros((), dtype=torch.float32, device=local.device)
                        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    step = state["step"].add_(1 - skip)
                    offset, salt = shard_position(p)
                    lr, seed = (
                        group["lr"],
                        int32_seed(noise_seed(group["seed"], group["calls"], self.names.get(id(p), position), salt)),
                    )
                    if self.static:
                        lr = _as_tensor(lr, local.device, torch.float32)
                        offset, seed = (_as_tensor(v, local.device, torch.int32) for v in (offset, seed))
                    self.update(
                        local.view(-1),
                        local_tensor(settled_grad(p)).view(-1),
                        local_tensor(state["exp_avg"]).view(-1),
                        local_tensor(state["exp_avg_sq"]).view(-1),
                        skip,
                        1 - beta1**step,
                        (1 - beta2**step).sqrt(),
                        lr=lr,
                        beta1=beta1,
                        beta2=beta2,
                        eps=group["eps"],
                        weight_decay=group["weight_decay"],
                        stochastic=group["rounding"] == "stochastic",
                        offset=offset,
                        seed=seed,
                    )
        return loss
