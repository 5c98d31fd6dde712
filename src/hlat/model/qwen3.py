"""Qwen3 dense as single-device code: LLaMA's decoder with QK-norm, an RMSNorm over head_dim
applied to each query and key head before RoPE (transformers' Qwen3ForCausalLM).

Everything else is LLaMA's (RMSNorm, SwiGLU, RoPE, GQA, head_dim set on its own, tied
embeddings), so the classes below only swap the attention in; the sizes and the Hugging Face
mapping are LLaMA's plus the two norms per layer.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from hlat.config.model import ModelConfig
from hlat.errors import ConfigError
from hlat.model.hf import LAYER_NAMES, HFMapping, decoder_config_from_hf, hf_config_dict, renamed_to_hf, renamed_to_hlat
from hlat.model.llama import Attention, Llama, RMSNorm, TransformerBlock
from hlat.model.size import llama_params, stage_flops, training_flops

T = TypeVar("T")


class Qwen3Attention(Attention):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.q_norm = RMSNorm(self.head_dim, cfg.norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.norm_eps)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = super().heads(x)
        return self.q_norm(q), self.k_norm(k), v


class Qwen3Block(TransformerBlock):
    attention_class = Qwen3Attention


class Qwen3(Llama):
    """Decoder-only Qwen3 dense; built, initialised (the norms to ones) and run as Llama is."""

    block_class = Qwen3Block


def qwen3_params(cfg: ModelConfig) -> int:
    """Exact number of parameters of `Qwen3(cfg)`: LLaMA's and the two head_dim norms per layer."""
    return llama_params(cfg) + 2 * cfg.n_layers * cfg.attn_head_dim


def qwen3_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token, with the attention as wide as its query heads (n_heads x head_dim:
    Qwen3-0.6B's is twice its d_model), as torchtitan counts Qwen3."""
    return training_flops(cfg, qwen3_params(cfg), cfg.n_heads * cfg.attn_head_dim, seq_len)


def qwen3_stage_costs(cfg: ModelConfig) -> tuple[float, float]:
    return stage_flops(cfg, cfg.n_heads * cfg.attn_head_dim)


QWEN3_LAYER_NAMES = {
    **LAYER_NAMES,
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
}


def qwen3_config_dict(cfg: ModelConfig) -> dict[str, Any]:
    """Keyword arguments for transformers.Qwen3Config describing the same architecture."""
    if cfg.mlp_bias:
        raise ConfigError(
            [("model.mlp_bias", "true, but Qwen3 has no MLP biases: transformers' Qwen3 cannot hold this model")]
        )
    return {**{k: v for k, v in hf_config_dict(cfg).items() if k != "mlp_bias"}, "use_sliding_window": False}


def qwen3_config_from_hf(d: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a Qwen3Config dict; sliding-window attention is refused (hlat attends to
    every earlier position)."""
    if d.get("use_sliding_window"):
        raise ValueError("use_sliding_window=true: hlat's Qwen3 attends to every position (no sliding window)")
    return decoder_config_from_hf(d, "qwen3")


def qwen3_to_hlat(state_dict: dict[str, T]) -> dict[str, T]:
    return renamed_to_hlat(state_dict, QWEN3_LAYER_NAMES)


def qwen3_to_hf(state_dict: dict[str, T]) -> dict[str, T]:
    return renamed_to_hf(state_dict, QWEN3_LAYER_NAMES)


QWEN3_HF = HFMapping("qwen3", "Qwen3ForCausalLM", qwen3_config_dict, qwen3_config_from_hf, qwen3_to_hlat, qwen3_to_hf)
