"""Analytic parameter and FLOP counts (no model is built, so 70B is free to size)."""

from __future__ import annotations

from hlat.model.config import ModelConfig


def count_params(cfg: ModelConfig) -> int:
    """Exact number of parameters of `Llama(cfg)` (untied embeddings, no biases)."""
    d, q_dim, kv_dim = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    attention = d * q_dim + 2 * d * kv_dim + q_dim * d  # wq, wk, wv, wo
    feed_forward = 3 * d * cfg.ffn_dim  # w1, w2, w3
    block = attention + feed_forward + 2 * d  # + attention_norm, ffn_norm
    return 2 * cfg.vocab_size * d + cfg.n_layers * block + d  # embeddings, output, final norm


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), PaLM / torchtitan convention:

        6 * (N - vocab_size * d_model) + 12 * n_layers * d_model * seq_len

    6N: each weight costs 2 FLOPs (multiply-add) per token forward and 4 backward. The input
    embedding is a lookup, not a matmul, so it is excluded; the output head is counted. The second
    term is QK^T and AV (2 matmuls x 2 FLOPs x 3 for fwd+bwd, over seq_len keys per layer), not
    halved for the causal mask, as in PaLM's MFU. Norms, softmax and activations are ignored.
    """
    n = count_params(cfg) - cfg.vocab_size * cfg.d_model
    return float(6 * n + 12 * cfg.n_layers * cfg.d_model * seq_len)
