"""Gradient accumulation under the precision and resharding switches (a scenario of
test_accumulation.py): parity_worker's model and global batches, 4 micro-batches of 2 sequences
per step on one process, over tp 2 or pp 2, or 2 per rank over dp 2, recording losses, full
weights, the first step's accumulated gradients and how many FSDP2 all-gathers each step ran.
"""

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import torch
import torch.distributed.fsdp._fully_shard._fsdp_param_group as fsdp_group
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from hlat.config.layout import Degrees
from hlat.config.optim import OptimConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import Batch, labels_for
from hlat.optim import build_adamw
from hlat.parallel.mesh import Layout, make_layout
from hlat.parallel.parallelize import ParallelModel, build_parallel_model
from hlat.precision import bf16_rounding
from hlat.train.optimizers import Optimizers
from hlat.train.step import train_step
from parallel.parity_worker import GLOBAL_BATCH, MICRO, MODEL, global_batches

GATHERS = [0]
_gather = fsdp_group.foreach_all_gather


def _counted_gather(*args, **kwargs):
    GATHERS[0] += 1
    return _gather(*args, **kwargs)


fsdp_group.foreach_all_gather = _counted_gather


@dataclasses.dataclass(frozen=True)
class Run:
    """One accumulation run: its degrees (at most one of dp, tp, pp above 1), data-parallel
    sharding, precision mode, and the switches under test: reshard_after_backward (false keeps the
    weights gathered between micro-batches) and fp32_grad_accum."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    dp_sharding: str = "ddp"
    mode: str = "fp32"
    reshard_after_backward: bool = True
    fp32_grad_accum: bool = False

    @property
    def id(self) -> str:
        """Readable and unique, e.g. dp2-fsdp-mixed-keep or 1-ddp-bf16-sr-fp32acc; names its result files."""
        degrees = [f"{dim}{n}" for dim, n in (("dp", self.dp), ("tp", self.tp), ("pp", self.pp)) if n > 1]
        return "-".join(
            (
                *(degrees or ["1"]),
                self.dp_sharding,
                self.mode,
                *(["keep"] if not self.reshard_after_backward else []),
                *(["fp32acc"] if self.fp32_grad_accum else []),
            )
        )

    @property
    def degrees(self) -> Degrees:
        return Degrees(pp=self.pp, dp_shard=self.dp, tp=self.tp)


@contextlib.contextmanager
def recording_grads(model: ParallelModel, into: dict[str, torch.Tensor]) -> Iterator[None]:
    """Copy the accumulated gradients (full tensors, fp32) into `into` as train_step has them
    before clipping: what the micro-batches summed to, in the parameters' dtype."""
    clip = model.clip_grad_norm_

    def record_then_clip(max_norm: float, norm: torch.Tensor | None = None) -> torch.Tensor:
        for part in model.raw_parts:
            for name, p in part.named_parameters():
                grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                into[name] = grad.detach().float().clone()
        return clip(max_norm, norm)

    with mock.patch.object(model, "clip_grad_norm_", record_then_clip):
        yield


def run(spec: Run, layout: Layout, out: Path) -> None:
    """Train the global batches under `spec` and save its losses, gathers and weights as files named by spec.id."""
    par = ParallelConfig(
        pp=spec.pp,
        dp=spec.dp,
        tp=spec.tp,
        dp_sharding=spec.dp_sharding,
        reshard_after_backward=spec.reshard_after_backward,
    )
    precision = PrecisionConfig(mode=spec.mode, fp32_grad_accum=spec.fp32_grad_accum)
    per_dp = GLOBAL_BATCH // layout.dp
    model = build_parallel_model(
        MODEL,
        parallel=par,
        layout=layout,
        device=torch.device("cpu"),
        seed=7,
        n_microbatches=per_dp // MICRO,
        precision=precision,
    )
    optimizers = Optimizers(
        model.parts,
        lambda part: build_adamw(part, OptimConfig(lr=1e-3), bf16_rounding(spec.mode), seed=3, compile=False),
    )
    losses, gathers, grads = [], [], {}
    for step, tokens in enumerate(global_batches()):
        mine = tokens[layout.dp_rank * per_dp : (layout.dp_rank + 1) * per_dp]
        batches = [Batch(mine[i : i + MICRO], labels_for(mine[i : i + MICRO])) for i in range(0, per_dp, MICRO)]
        before = GATHERS[0]
        with recording_grads(model, grads) if step == 0 else contextlib.nullcontext():
            rank_loss, _ = train_step(model, optimizers, batches, grad_clip=1.0)
        gathers.append(GATHERS[0] - before)
        losses.append(model.reduce_loss(rank_loss).item())
    full = get_model_state_dict(model.parts[0], options=StateDictOptions(full_state_dict=True))
    tag = spec.id
    if layout.dp_rank == 0 and layout.coordinate("tp") == 0:  # each pipeline stage saves its own layers
        torch.save({k: v.detach().float().clone() for k, v in full.items()}, out / f"{tag}.rank{layout.rank}.pt")
        torch.save(grads, out / f"{tag}.grads.rank{layout.rank}.pt")
    if layout.rank == 0:
        (out / f"{tag}.json").write_text(json.dumps({"losses": losses, "gathers": gathers}))


def runs(ctx, runs: list[dict]) -> None:
    """Scenario: each run (a Run as a dict) in turn over this scenario's processes."""
    for spec in (Run(**fields) for fields in runs):
        degrees = spec.degrees
        layout = Layout(1, 0, degrees, None) if ctx.world == 1 else make_layout(degrees, torch.device("cpu"))
        run(spec, layout, ctx.out)
