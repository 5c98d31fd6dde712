"""Pipeline parallelism: split a model into stages by layers, and build the schedule.

Stages are contiguous layer ranges chosen to balance compute (the per-layer and head costs of
the family's spec, hlat.model.spec), with the output head (a d x vocab matmul) counted on the last
stage; the embedding lookup costs next to nothing. Each rank holds `pp_stages_per_rank` stages,
assigned round-robin (rank r holds stages r, r + pp, ...), which is what the interleaved schedule
expects.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from hlat.errors import ConfigError


def split_layers(n_layers: int, n_stages: int, layer_cost: float, head_cost: float) -> list[range]:
    """Contiguous layer ranges per stage minimising the costliest stage (the last adds the head)."""
    if n_stages > n_layers:
        raise ConfigError(
            [("parallel.pp", f"{n_stages} pipeline stages need at least as many layers; the model has {n_layers}")]
        )
    # best[s][i]: minimal max-cost splitting the first i layers into s stages (last stage not yet).
    inf = float("inf")
    best = [[inf] * (n_layers + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n_layers + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, n_stages + 1):
        extra = head_cost if s == n_stages else 0.0
        for i in range(s, n_layers + 1):
            for j in range(s - 1, i):
                cost = max(best[s - 1][j], (i - j) * layer_cost + (extra if i == n_layers else 0.0))
                if cost < best[s][i]:
                    best[s][i], cut[s][i] = cost, j
    bounds, i = [], n_layers
    for s in range(n_stages, 0, -1):
        bounds.append(range(cut[s][i], i))
        i = cut[s][i]
    return bounds[::-1]


def stage_indices(pp_rank: int, pp: int, per_rank: int) -> list[int]:
    return [pp_rank + k * pp for k in range(per_rank)]


def cut_stage(model: nn.Module, layers: range, first: bool, last: bool) -> nn.Module:
    """Keep only this stage's parts of `model` (built on meta: nothing real is freed or copied).

    With tied embeddings the last stage keeps tok_embeddings, never looked up, as the home of its
    output head's matrix: its copy then has the name, initial values, optimizer group and
    checkpoint key of the first stage's (`tok_embeddings.weight`, the name without pipeline
    parallelism), and hlat.parallel.tied_embeddings sums the two copies' gradients.
    """
    for name in list(model.layers.keys()):
        if int(name) not in layers:
            del model.layers[name]
    if not first:
        model.embeds_tokens = False
        if not (last and model.cfg.tie_embeddings):
            model.tok_embeddings = None
    if not last:
        model.norm = None
        model.output = None
    return model


def build_schedule(
    stage_modules: list[nn.Module],
    indices: list[int],
    n_stages: int,
    device: torch.device,
    group,
    name: str,
    n_microbatches: int,
    loss_fn: Callable,
):  # type: ignore[no-untyped-def]
    """`n_microbatches` 1 (train.deterministic: a schedule step per micro-batch) runs as GPipe, which
    is then every schedule's order: one forward through the stages, then one backward."""
    if 1 < n_microbatches < n_stages // len(indices):
        raise ConfigError(
            [
                (
                    "train.micro_batch",
                    f"pipeline parallel needs at least pp={n_stages // len(indices)} micro-batches per step, "
                    f"got {n_microbatches}; lower train.micro_batch or raise train.global_batch",
                )
            ]
        )
    stages = [PipelineStage(m, i, n_stages, device, group=group) for m, i in zip(stage_modules, indices)]
    # Our loss_fn already divides by the global target count, so the schedule must not rescale.
    if name == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(stages, n_microbatches, loss_fn=loss_fn, scale_grads=False)
    cls = ScheduleGPipe if n_microbatches == 1 else {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}[name]
    return cls(stages[0], n_microbatches, loss_fn=loss_fn, scale_grads=False)
