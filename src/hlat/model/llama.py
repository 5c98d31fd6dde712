"""LLaMA decoder (HLAT 7B/70B shape) as single-device code.

Parallelism is applied from outside (hlat.parallel), so this file relies on two conventions:
module names are stable (tensor-parallel plans and the HF mapping target them), and head counts
are read from tensor shapes at runtime, so sharding heads across ranks needs no code change here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hlat.model.config import ModelConfig
from hlat.model.kv_cache import KVCache, LayerKV


class RMSNorm(nn.Module):
    """RMSNorm with HF LlamaRMSNorm numerics: normalise in fp32, cast back, then scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))  # ones: Llama.init_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_tables(head_dim: int, max_seq_len: int, theta: float,
                device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the RoPE angles, [max_seq_len, head_dim // 2], always fp32 (bf16 angles at
    position ~4000 would be off by whole radians)."""
    dims = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device)
    inv_freq = 1.0 / theta ** (dims / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32, device=device), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (the HF transformers convention): x [B, T, H, D], cos/sin [B|1, T, 1, D/2].
    The rotation is done in fp32 and cast back."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


def core_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   attn_mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(QK^T/sqrt(d)) V on [B, H, T, D]; a standalone function so selective activation
    checkpointing can recompute exactly this (including the GQA repeat, whose copies of k/v
    would otherwise be saved for backward)."""
    n_rep = q.size(1) // k.size(1)  # from shapes: correct for local (tensor-parallel) head counts
    if n_rep > 1:
        k = k.repeat_interleave(n_rep, dim=1)  # kv head j serves q heads j*n_rep .. (j+1)*n_rep-1
        v = v.repeat_interleave(n_rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The SwiGLU product silu(gate) * up; standalone so selective checkpointing can target it."""
    return F.silu(gate) * up


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn_mask: torch.Tensor | None, kv: LayerKV | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        # -1 = local head count: under tensor parallelism wq/wk/wv hold a slice of the heads.
        # The tables may cover more positions than x (under sequence parallel the caller sees only
        # its shard of the sequence; x here is the gathered full sequence): keep the first T.
        cos, sin = cos[:, :T], sin[:, :T]
        q = apply_rope(self.wq(x).view(B, T, -1, self.head_dim), cos, sin)
        k = apply_rope(self.wk(x).view(B, T, -1, self.head_dim), cos, sin)
        v = self.wv(x).view(B, T, -1, self.head_dim)
        if kv is not None:  # attend to the cached positions as well (rotated at their own positions)
            k, v = kv.extend(k, v)
        out = core_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)  # gate
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)  # down
        self.w3 = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(swiglu(self.w1(x), self.w3(x)))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn_mask: torch.Tensor | None, kv: LayerKV | None = None) -> torch.Tensor:
        # kv by keyword: tensor-parallel input hooks see the four positional inputs only
        x = x + self.attention(self.attention_norm(x), cos, sin, attn_mask, kv=kv)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Decoder-only LLaMA. Construction initialises the weights; it also works under
    `torch.device("meta")`, after which call `to_empty(device=...)` and `init_weights()`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # A dict keyed by the global layer index: a pipeline stage that drops layers keeps the
        # names ("layers.40...") of the full model, so checkpoints reshard across layouts.
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.output = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # untied from embeddings
        # Non-persistent: derived from the config, so they stay out of checkpoints.
        table_shape = (cfg.max_seq_len, cfg.head_dim // 2)
        self.register_buffer("rope_cos", torch.empty(table_shape), persistent=False)
        self.register_buffer("rope_sin", torch.empty(table_shape), persistent=False)
        self.init_weights()

    def reset_rope(self) -> None:
        """Recompute the RoPE tables (non-persistent buffers: after to_empty they hold garbage)."""
        cfg = self.cfg
        self.rope_cos, self.rope_sin = rope_tables(
            cfg.head_dim, cfg.max_seq_len, cfg.rope_theta, device=self.rope_cos.device)

    @torch.no_grad()
    def init_weights(self) -> None:
        """HLAT init of every parameter by its name (init_std_of): N(0, init_std) everywhere,
        N(0, init_std/sqrt(2L)) for wo and w2, norms 1. A pipeline stage inits what it holds."""
        for name, param in self.named_parameters():
            std = self.init_std_of(name)
            if std is None:
                nn.init.ones_(param)
            else:
                nn.init.normal_(param, mean=0.0, std=std)
        self.reset_rope()

    def init_std_of(self, name: str) -> float | None:
        """Init std of parameter `name` (its state-dict name); None for norm weights (ones).

        The same rule as init_weights, by name, so a sharded or staged model can initialise each
        parameter independently and match the single-device model exactly.
        """
        if name.endswith("norm.weight"):
            return None
        std = self.cfg.init_std
        if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
            # Scaled init of the projections into the residual stream (GPT-2/Megatron); L of the
            # full model, also on a pipeline stage.
            return std / math.sqrt(2 * self.cfg.n_layers)
        return std

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        # A dtype cast (model.to(torch.bfloat16)) would quantise the RoPE tables: rebuild in fp32.
        super()._apply(fn, recurse)
        if self.rope_cos.dtype != torch.float32:
            self.reset_rope()
        return self

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, vocab] in the compute dtype.

        positions: [B, T] token positions (default 0..T-1), e.g. reset at document starts.
        attn_mask: bool, broadcastable to [B, 1, T, T], True = may attend. It replaces the causal
        mask, so it must include causality itself (e.g. causal AND same-document).
        cache: keys and values of earlier calls (incremental decoding), extended by this one; then
        `positions` and `attn_mask` ([B, 1, T, cached + T]) are required.
        On a pipeline stage whose tok_embeddings is None, `tokens` are the incoming hidden states.
        """
        if cache is not None and (positions is None or attn_mask is None):
            raise ValueError("with a KV cache, pass positions and an attn_mask over the cached and new positions")
        if positions is None:
            cos, sin = self.rope_cos[None, :, None], self.rope_sin[None, :, None]
        else:
            cos, sin = self.rope_cos[positions][:, :, None], self.rope_sin[positions][:, :, None]
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            raise TypeError(f"attn_mask must be bool (True = may attend), got {attn_mask.dtype}")
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for name, layer in self.layers.items():
            h = layer(h, cos, sin, attn_mask, kv=None if cache is None else cache.layer(name))
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h
