"""LLaMA's analytic parameter, FLOP and pipeline-stage costs (no model is built, so 70B is free to
size). Other families build theirs from these (hlat.model.qwen3); hlat.model.spec picks by family."""

from __future__ import annotations

from hlat.config.model import ModelConfig


def llama_params(cfg: ModelConfig) -> int:
    """Exact number of parameters of `Llama(cfg)` (a tied output head is the embedding: counted once)."""
    d, q_dim, kv_dim = cfg.d_model, cfg.n_heads * cfg.attn_head_dim, cfg.n_kv_heads * cfg.attn_head_dim
    attention = d * q_dim + 2 * d * kv_dim + q_dim * d  # wq, wk, wv, wo
    attention += (q_dim + 2 * kv_dim + d) if cfg.attention_bias else 0
    feed_forward = 3 * d * cfg.ffn_dim + ((2 * cfg.ffn_dim + d) if cfg.mlp_bias else 0)  # w1, w2, w3
    block = attention + feed_forward + 2 * d  # + attention_norm, ffn_norm
    heads = 1 if cfg.tie_embeddings else 2  # embeddings, output
    return heads * cfg.vocab_size * d + cfg.n_layers * block + d  # + final norm


def training_flops(cfg: ModelConfig, params: int, attention_width: int, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) of a decoder of `params` parameters, PaLM /
    torchtitan convention:

        6 * (params - vocab_size * d_model) + 12 * n_layers * attention_width * seq_len

    6N: each weight costs 2 FLOPs (multiply-add) per token forward and 4 backward. The input
    embedding is a lookup, not a matmul, so it is excluded; the output head is counted. The second
    term is QK^T and AV (2 matmuls x 2 FLOPs x 3 for fwd+bwd, over seq_len keys per layer, each
    as wide as all query heads together), not halved for the causal mask, as in PaLM's MFU.
    Norms, softmax and activations are ignored.
    """
    # a tied matrix is counted once, and its matmul use (the output head) is the one that costs
    n = params - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)
    return float(6 * n + 12 * cfg.n_layers * attention_width * seq_len)


def llama_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """training_flops with the attention as wide as d_model (the LLaMA rule of n_heads x head_dim)."""
    return training_flops(cfg, llama_params(cfg), cfg.d_model, seq_len)


def stage_flops(cfg: ModelConfig, q_dim: int) -> tuple[float, float]:
    """(per-layer, head) matmul FLOPs per token of a decoder whose query heads are `q_dim` wide:
    the quantities hlat.parallel.pipeline.split_layers balances."""
    kv = cfg.n_kv_heads * cfg.attn_head_dim
    layer = 2 * cfg.d_model * (2 * q_dim + 2 * kv) + 6 * cfg.d_model * cfg.ffn_dim
    return float(layer), float(2 * cfg.d_model * cfg.vocab_size)


def llama_stage_costs(cfg: ModelConfig) -> tuple[float, float]:
    """stage_flops with the query heads as wide as d_model (the LLaMA rule)."""
    return stage_flops(cfg, cfg.d_model)
