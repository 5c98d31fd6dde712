"""Analytic parameter and FLOP counts (no model is built, so 70B is free to size)."""

from __future__ import annotations

from hlat.config.model import ModelConfig


def count_params(cfg: ModelConfig) -> int:
    """Exact number of parameters of `Llama(cfg)` (a tied output head is the embedding: counted once)."""
    d, q_dim, kv_dim = cfg.d_model, cfg.n_heads * cfg.attn_head_dim, cfg.n_kv_heads * cfg.attn_head_dim
    attention = d * q_dim + 2 * d * kv_dim + q_dim * d  # wq, wk, wv, wo
    attention += (q_dim + 2 * kv_dim + d) if cfg.attention_bias else 0
    feed_forward = 3 * d * cfg.ffn_dim + ((2 * cfg.ffn_dim + d) if cfg.mlp_bias else 0)  # w1, w2, w3
    block = attention + feed_forward + 2 * d  # + attention_norm, ffn_norm
    heads = 1 if cfg.tie_embeddings else 2  # embeddings, output
    return heads * cfg.vocab_size * d + cfg.n_layers * block + d  # + final norm


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), PaLM / torchtitan convention:

        6 * (N - vocab_size * d_model) + 12 * n_layers * d_model * seq_len

    6N: each weight costs 2 FLOPs (multiply-add) per token forward and 4 backward. The input
    embedding is a lookup, not a matmul, so it is excluded; the output head is counted. The second
    term is QK^T and AV (2 matmuls x 2 FLOPs x 3 for fwd+bwd, over seq_len keys per layer), not
    halved for the causal mask, as in PaLM's MFU. Norms, softmax and activations are ignored.
    """
    # a tied matrix is counted once, and its matmul use (the output head) is the one that costs
    n = count_params(cfg) - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)
    return float(6 * n + 12 * cfg.n_layers * cfg.d_model * seq_len)
