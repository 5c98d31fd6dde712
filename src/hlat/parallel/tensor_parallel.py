"""Megatron-style tensor + sequence parallelism for hlat's Llama, with DTensor plans.

Between blocks the residual stream is sharded on the sequence dim (Shard(1)); each block gathers
it before attention/MLP (all-gather), splits heads and FFN columns across the tp ranks, and
reduce-scatters back to sequence shards. The embedding is vocab-parallel, and the output head
keeps logits sharded on the vocab dim for `loss_parallel`, so full logits are never gathered.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from hlat.errors import ConfigError
from hlat.model.config import ModelConfig


def check_tensor_parallel(cfg: ModelConfig, tp: int) -> None:
    problems = []
    if cfg.n_heads % tp:
        problems.append(("parallel.tp", f"tp={tp} does not divide model.n_heads={cfg.n_heads}"))
    if cfg.n_kv_heads % tp:
        # Splitting fewer KV heads than ranks needs KV replication (HLAT 70B did it on Trainium);
        # refusing is better than computing the wrong attention.
        problems.append(("parallel.tp", f"tp={tp} does not divide model.n_kv_heads={cfg.n_kv_heads}; use tp <= {cfg.n_kv_heads} (a divisor of it)"))
    for field, size in (("model.ffn_dim", cfg.ffn_dim), ("model.vocab_size", cfg.vocab_size)):
        if size % tp:
            problems.append((field, f"{size} is not divisible by parallel.tp={tp}"))
    if problems:
        raise ConfigError(problems)


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard `model` (a full Llama or a pipeline stage of one) over `tp_mesh` in place."""
    top: dict[str, object] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            # (x, cos, sin, attn_mask): only x is sharded; the RoPE tables and mask are replicated.
            "attention": PrepareModuleInput(
                input_layouts=(Shard(1), None, None, None),
                desired_input_layouts=(Replicate(), None, None, None),
                use_local_output=True,
            ),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })
