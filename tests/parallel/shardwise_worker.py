"""The global norm and AdamW computed from each rank's shards (hlat.parallel.grad_norm,
hlat.optim.adamw.ShardwiseAdamW) against torch's own DTensor ops, on a 2 x 2 mesh (dp_shard, tp)
(a scenario of test_shardwise.py, see tests/runs.py). Rank 0 writes results.json."""

import json

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

from hlat.dtensor import full_tensor
from hlat.optim.adamw import ShardwiseAdamW
from hlat.parallel.grad_norm import total_norm

# Every kind of placement a gradient has under FSDP2 x TP: sharded on both dimensions (FSDP2's
# rows of TP's rows are a _StridedShard), on one of them (the other replicated), on neither, uneven
# rows (5 over 2 ranks), and a plain tensor.
PLACEMENTS = [
    (_StridedShard(0, split_factor=2), Shard(0)),
    (Shard(0), Shard(1)),
    (Shard(0), Replicate()),
    (Replicate(), Shard(0)),
    (Replicate(), Replicate()),
]
SHAPES = [(8, 3), (4, 6), (5, 3), (6, 2), (3,)]


def _tensors(mesh, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    whole = [torch.randn(shape, generator=gen) for shape in SHAPES]
    return [distribute_tensor(w, mesh, p) for w, p in zip(whole, PLACEMENTS)] + [torch.randn(7, generator=gen)]


def compare(ctx) -> None:
    """Scenario (world 4)."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    tensors = _tensors(mesh, 0)
    ours = total_norm(tensors)
    # torch's norm takes no list of DTensors and plain tensors together
    dtensors = tensors[:-1]
    ours_dtensors, torch_norm = total_norm(dtensors), full_tensor(torch.nn.utils.get_total_norm(dtensors, foreach=True))
    whole = torch.cat([full_tensor(t).flatten() for t in tensors]).double().norm()

    partial = DTensor.from_local(torch.ones(2), mesh, (Replicate(), Partial()))
    try:
        total_norm([partial])
        refused = ""
    except ValueError as error:
        refused = str(error)

    # AdamW: the same parameters, gradients (one partial over tp, as a replicated norm weight's is)
    # and steps through torch's DTensor dispatch and shard by shard
    runs = {}
    for name, cls in (("torch", torch.optim.AdamW), ("shardwise", ShardwiseAdamW)):
        params = [torch.nn.Parameter(t) for t in _tensors(mesh, 0)[:-1]]
        opt = cls(params, lr=1e-2, weight_decay=0.1, fused=True)
        for step in range(3):
            for i, p in enumerate(params):
                g = _tensors(mesh, step + 1)[i]
                if i == len(PLACEMENTS) - 1:  # tp ranks each hold part of a sum: torch reduces it inside its step
                    g = DTensor.from_local(g.to_local() / 2, mesh, (Replicate(), Partial()))
                p.grad = g
            opt.step()
        state = opt.state_dict()["state"]
        runs[name] = {
            "params": [full_tensor(p.detach()).tolist() for p in params],
            "state": [[full_tensor(s[k]).tolist() for k in ("step", "exp_avg", "exp_avg_sq")] for s in state.values()],
            "state_types": sorted({type(s["exp_avg"]).__name__ for s in state.values()}),
        }
    if ctx.rank == 0:
        result = {
            "ours": ours.item(),
            "ours_dtensors": ours_dtensors.item(),
            "torch": torch_norm.item(),
            "whole": whole.item(),
            "ours_dtype": str(ours.dtype),
            "refused": refused,
            "adamw": runs,
        }
        (ctx.out / "results.json").write_text(json.dumps(result))
