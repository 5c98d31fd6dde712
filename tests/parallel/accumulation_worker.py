"""Gradient accumulation under the precision and resharding switches (a scenario of
test_accumulation.py): parity_worker's model and global batches, 4 micro-batches of 2 sequences
per step on one process, over tp 2 or pp 2, or 2 per rank over dp 2, recording losses, full
weights and how many FSDP2 all-gathers each step ran.
"""

import json
from pathlib import Path

import torch
import torch.distributed.fsdp._fully_shard._fsdp_param_group as fsdp_group
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from hlat.config.layout import Degrees
from hlat.config.optim import OptimConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import Batch, labels_for
from hlat.optim import build_adamw
from hlat.parallel.mesh import Layout, make_layout
from hlat.parallel.parallelize import build_parallel_model
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


def run(spec: str, layout: Layout, out: Path) -> None:
    """spec: "layout,sharding,mode,options": layout 1, dp2, tp2 or pp2; options "+"-joined from
    keep (reshard_after_backward false), fp32acc (fp32_grad_accum), bf16reduce (reduce_dtype bf16)."""
    _, sharding, mode, options = spec.split(",")
    flags = set(options.split("+"))
    par = ParallelConfig(
        pp=layout.pp, dp=layout.dp, tp=layout.tp, dp_sharding=sharding, reshard_after_backward="keep" not in flags
    )
    precision = PrecisionConfig(
        mode=mode, fp32_grad_accum="fp32acc" in flags, reduce_dtype="bf16" if "bf16reduce" in flags else "fp32"
    )
    per_dp = GLOBAL_BATCH // layout.dp
    model = build_parallel_model(
        MODEL, par, layout, torch.device("cpu"), seed=7, n_microbatches=per_dp // MICRO, precision_mode=precision
    )
    optimizers = Optimizers(
        model.parts, lambda part: build_adamw(part, OptimConfig(lr=1e-3), bf16_rounding(mode), seed=3, compile=False)
    )
    losses, gathers = [], []
    for tokens in global_batches():
        mine = tokens[layout.dp_rank * per_dp : (layout.dp_rank + 1) * per_dp]
        batches = [Batch(mine[i : i + MICRO], labels_for(mine[i : i + MICRO])) for i in range(0, per_dp, MICRO)]
        before = GATHERS[0]
        share, _ = train_step(model, optimizers, batches, grad_clip=1.0)
        gathers.append(GATHERS[0] - before)
        losses.append(model.reduce_loss(share).item())
    full = get_model_state_dict(model.parts[0], options=StateDictOptions(full_state_dict=True))
    tag = spec.replace(",", "_")
    if layout.dp_rank == 0 and layout.coordinate("tp") == 0:  # each pipeline stage saves its own layers
        torch.save({k: v.detach().float().clone() for k, v in full.items()}, out / f"{tag}.rank{layout.rank}.pt")
    if layout.rank == 0:
        (out / f"{tag}.json").write_text(json.dumps({"losses": losses, "gathers": gathers}))


def specs(ctx, specs: list[str]) -> None:
    """Scenario: each spec in turn over this scenario's processes."""
    for spec in specs:
        kind = spec.split(",")[0]
        degrees = {"1": Degrees(), "dp2": Degrees(dp_shard=2), "tp2": Degrees(tp=2), "pp2": Degrees(pp=2)}[kind]
        layout = Layout(1, 0, degrees, None) if ctx.world == 1 else make_layout(degrees, torch.device("cpu"))
        run(spec, layout, ctx.out)
