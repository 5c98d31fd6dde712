"""One spec per model family: what the trainer, the planner, import/export and evaluation need to
know about a family, looked up by `model.family`.

A new family is one module (its nn.Module, reusing LLaMA's blocks where they are the same; its
sizes; its Hugging Face mapping) and one entry in SPECS. The tensor-parallel plan is data: each
block module's role, which hlat.parallel.tensor_parallel turns into DTensor styles, so the model
layer names no rank or mesh.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from hlat.config.model import ModelConfig
from hlat.model.hf import LLAMA_HF, HFMapping
from hlat.model.llama import Llama
from hlat.model.qwen3 import QWEN3_HF, Qwen3, qwen3_flops_per_token, qwen3_params, qwen3_stage_costs
from hlat.model.size import llama_flops_per_token, llama_params, llama_stage_costs

# A block module's part in Megatron-style tensor + sequence parallelism:
#   sequence_norm    a norm on the sequence-sharded residual stream
#   attention_input  gathers the sequence before attention (its inputs: x, cos, sin, mask)
#   ffn_input        gathers the sequence before the feed-forward
#   column / row     a linear split by output / input features (row: reduce-scattered back)
#   kv               wk or wv: split by KV heads, or replicated when tp exceeds them
#   head_norm        a norm over head_dim of each head of a head-sharded activation
TPRole = Literal["sequence_norm", "attention_input", "ffn_input", "column", "row", "kv", "head_norm"]

LLAMA_TP_PLAN: dict[str, TPRole] = {
    "attention_norm": "sequence_norm",
    "attention": "attention_input",
    "attention.wq": "column",
    "attention.wk": "kv",
    "attention.wv": "kv",
    "attention.wo": "row",
    "ffn_norm": "sequence_norm",
    "feed_forward": "ffn_input",
    "feed_forward.w1": "column",
    "feed_forward.w2": "row",
    "feed_forward.w3": "column",
}


@dataclass(frozen=True)
class ModelSpec:
    family: str
    # built from a ModelConfig; the top-level layout (tok_embeddings, layers, norm, output) is LLaMA's
    model: type[Llama]
    tensor_parallel: Mapping[str, TPRole]  # each block module's role, by its name in the block
    stage_costs: Callable[[ModelConfig], tuple[float, float]]  # (per-layer, head) FLOPs the pipeline split balances
    hf: HFMapping
    count_params: Callable[[ModelConfig], int]  # exact, as the built model's
    flops_per_token: Callable[[ModelConfig, int], float]  # training FLOPs per token at a sequence length (MFU)
    # flops_per_token as `hlat params` states it: N parameters, L layers, d d_model, T seq_len
    flops_formula: str


LLAMA = ModelSpec(
    "llama", Llama, LLAMA_TP_PLAN, llama_stage_costs, LLAMA_HF, llama_params, llama_flops_per_token, "6N + 12·L·d·T"
)
QWEN3 = ModelSpec(
    "qwen3",
    Qwen3,
    {**LLAMA_TP_PLAN, "attention.q_norm": "head_norm", "attention.k_norm": "head_norm"},
    qwen3_stage_costs,
    QWEN3_HF,
    qwen3_params,
    qwen3_flops_per_token,
    "6N + 12·L·(n_heads·head_dim)·T",
)
SPECS: dict[str, ModelSpec] = {spec.family: spec for spec in (LLAMA, QWEN3)}  # ModelConfig.family's Literal names these


def model_spec(cfg: ModelConfig) -> ModelSpec:
    return SPECS[cfg.family]


def build_model(cfg: ModelConfig) -> Llama:
    """The family's model of `cfg`, initialised (or on the current default device, e.g. meta)."""
    return model_spec(cfg).model(cfg)


def count_params(cfg: ModelConfig) -> int:
    """Exact number of parameters of the model of `cfg` (a tied output head counted once)."""
    return model_spec(cfg).count_params(cfg)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token of the model of `cfg` (hlat.model.size.training_flops)."""
    return model_spec(cfg).flops_per_token(cfg, seq_len)


def hf_spec(config: Mapping[str, Any]) -> ModelSpec:
    """The family of a Hugging Face config.json (by model_type; LLaMA when it names none), or
    ValueError naming the model types hlat loads."""
    model_type = config.get("model_type", "llama")
    for spec in SPECS.values():
        if spec.hf.model_type == model_type:
            return spec
    raise ValueError(
        f"model_type={model_type!r}: hlat loads the model types "
        f"{' and '.join(repr(s.hf.model_type) for s in SPECS.values())}"
    )
