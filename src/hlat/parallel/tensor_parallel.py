"""Megatron-style tensor + sequence parallelism for hlat's Llama, with DTensor plans.

Between blocks the residual stream is sharded on the sequence dim (Shard(1)); each block gathers
it before attention/MLP (all-gather), splits heads and FFN columns across the tp ranks, and
reduce-scatters back to sequence shards. The embedding is vocab-parallel, and the output head
keeps logits sharded on the vocab dim for `loss_parallel`, so full logits are never gathered.
Both shard the [vocab, d] matrix by vocab rows (Shard(0)), so tied embeddings stay one sharded
Parameter (Llama.tie_weights re-ties it after to_empty) whose gradient sums both uses. A
vocabulary tp does not divide is sharded unevenly, as torch.chunk splits it (127 rows over tp 2:
64 + 63): DTensor's embedding, matmul and loss_parallel take uneven shards, so nothing is padded
and checkpoints hold the true [vocab, d] matrix.

With more tp ranks than KV heads (HLAT 70B: TP 32, 8 KV heads) the KV projections are replicated
instead of split: every rank holds all KV heads' weights (with GQA a small share of the
attention's) and computes only the head its query heads attend with; the gradients are summed
over the tp ranks.

Which module of a block is which comes from the family's spec (hlat.model.spec: its
tensor_parallel roles). A per-head norm (Qwen3's QK-norm, over head_dim) keeps its weight
replicated and sees the head-sharded activation as sharded on the heads dim, so its gradient,
computed by each rank from its own heads, is summed over the tp ranks; each head is normalised
whole on one rank, so the sharding leaves the norm exact. Over replicated KV projections each
rank's k holds the one head it computes, and the sum adds each copy's share of that head's
gradient.

Float8 blocks (precision.float8: torchao's Float8Linear) take torchao's float8 styles for their
linears and their inputs, as torchtitan does: the same shardings, but each block input is cast to
float8 before its all-gather (gathered in float8, once for wq, wk and wv or w1 and w3) and each
linear's output gradient to float8 in backward. The casts' dynamic scales come from the amax of
the whole DTensor (a max over the tp ranks), so every scale is the one the unsharded tensor would
get and float8 under TP computes what it computes without TP. Replicated KV projections compute
outside the Float8Linear, so float8 refuses tp > n_kv_heads (hlat.float8).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from hlat.config.model import ModelConfig
from hlat.float8 import is_float8_linear
from hlat.model.llama import linear
from hlat.model.spec import TPRole, model_spec


class ReplicatedKV(ParallelStyle):
    """wk or wv with more tp ranks than KV heads: the weight replicated over tp, the input the full
    (gathered) sequence; each rank computes only the output columns of KV head
    `rank // (tp / n_kv_heads)`, the one its query heads use, from those rows of the weight (all
    heads on every rank would add a full KV projection to each rank's work: at HLAT 70B's TP 32 as
    many FLOPs as 64% of its share of the rest of the block). The output gradient is a partial sum
    (each rank fed back its own head's), so the weight and input gradients are summed over tp."""

    def __init__(self, head_dim: int, n_kv_heads: int) -> None:
        super().__init__()
        self.head_dim, self.n_kv_heads = head_dim, n_kv_heads

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        head = device_mesh.get_local_rank() // (device_mesh.size() // self.n_kv_heads)
        rows = slice(head * self.head_dim, (head + 1) * self.head_dim)

        def input_fn(_: nn.Module, inputs: tuple[torch.Tensor, ...], mesh: DeviceMesh) -> tuple[DTensor, ...]:
            return (DTensor.from_local(inputs[0], mesh, [Replicate()], run_check=False), *inputs[1:])

        def output_fn(_: nn.Module, output: DTensor, mesh: DeviceMesh) -> torch.Tensor:
            return output.to_local(grad_placements=[Partial()])

        def head_forward(x: DTensor) -> DTensor:
            # the rows of the replicated weight differ by rank, so the "replicated" result does too;
            # it is only read locally (output_fn) and its gradient declared partial
            return linear(x, module.weight[rows], None if module.bias is None else module.bias[rows])

        distributed = distribute_module(module, device_mesh, input_fn=input_fn, output_fn=output_fn)
        distributed.forward = head_forward
        return distributed


class VocabParallelEmbedding(RowwiseParallel):
    """The embedding sharded by vocab rows, its output reduce-scattered to sequence shards and
    handed to the first block as a plain tensor that holds its values. The reduce-scatter returns
    an AsyncCollectiveTensor (a tensor subclass that waits on first use); a compiled first block
    would take that subclass as its input, and AOT autograd returns a plain gradient for it, which
    the reduce-scatter's backward cannot take ("'Tensor' object has no attribute '_local_tensor'").
    Waiting here costs one copy of the [B, T/tp, d] shard per micro-batch."""

    def __init__(self) -> None:
        super().__init__(input_layouts=Replicate(), output_layouts=Shard(1))

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):  # type: ignore[no-untyped-def]
        local = RowwiseParallel._prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh)
        return local.clone() if isinstance(local, AsyncCollectiveTensor) else local


def _kv_style(cfg: ModelConfig, tp: int) -> ParallelStyle:
    return ReplicatedKV(cfg.attn_head_dim, cfg.n_kv_heads) if cfg.n_kv_heads < tp else ColwiseParallel()


# the sequence-sharded input gathered before attention (x, cos, sin, attn_mask: only x is sharded,
# the RoPE tables and the mask are replicated) and before the feed-forward
_INPUTS: dict[TPRole, dict[str, Any]] = {
    "attention_input": dict(
        input_layouts=(Shard(1), None, None, None),
        desired_input_layouts=(Replicate(), None, None, None),
        use_local_output=True,
    ),
    "ffn_input": dict(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True),
}

# each role's DTensor style, from the model config and the tp degree
_STYLES: dict[TPRole, Callable[[ModelConfig, int], ParallelStyle]] = {
    "sequence_norm": lambda cfg, tp: SequenceParallel(),
    "attention_input": lambda cfg, tp: PrepareModuleInput(**_INPUTS["attention_input"]),
    "ffn_input": lambda cfg, tp: PrepareModuleInput(**_INPUTS["ffn_input"]),
    "column": lambda cfg, tp: ColwiseParallel(),
    "row": lambda cfg, tp: RowwiseParallel(output_layouts=Shard(1)),
    "kv": _kv_style,
    "head_norm": lambda cfg, tp: SequenceParallel(sequence_dim=2, use_local_output=True),  # [B, T, heads, head_dim]
}


def _float8_styles(
    block: nn.Module, plan: Mapping[str, TPRole], styles: dict[str, ParallelStyle]
) -> dict[str, ParallelStyle]:
    """`styles` with torchao's float8 styles for `block`'s Float8Linears, and for an input gathered
    only into Float8Linears (a linear left unconverted, by its width, takes the gathered input in
    the mode's dtype and its neighbours cast it after the gather)."""
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    def float8(name: str) -> bool:
        return is_float8_linear(block.get_submodule(name))

    out = dict(styles)
    for name, role in plan.items():
        if role in ("column", "kv") and float8(name):
            if isinstance(styles[name], ReplicatedKV):
                raise ValueError(f"{name}: float8 cannot run replicated KV projections (tp > n_kv_heads)")
            out[name] = Float8ColwiseParallel()
        elif role == "row" and float8(name):
            out[name] = Float8RowwiseParallel(output_layouts=Shard(1))
        elif role in _INPUTS:
            readers = [n for n, r in plan.items() if n.startswith(f"{name}.") and r in ("column", "kv")]
            if all(float8(n) for n in readers):
                out[name] = PrepareFloat8ModuleInput(**_INPUTS[role])
    return out


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard `model` (a full model of any family, or a pipeline stage of one) over `tp_mesh` in
    place; float8 blocks (hlat.float8.convert_to_float8, called before this) with float8 styles."""
    cfg: ModelConfig = model.cfg
    top: dict[str, object] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = VocabParallelEmbedding()
    if model.norm is not None:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(model, tp_mesh, top)
    plan = model_spec(cfg).tensor_parallel
    for block in model.layers.values():
        styles = {name: _STYLES[role](cfg, tp_mesh.size()) for name, role in plan.items()}
        if any(is_float8_linear(m) for m in block.modules()):
            styles = _float8_styles(block, plan, styles)
        parallelize_module(block, tp_mesh, styles)
