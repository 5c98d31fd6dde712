"""LLaMA decoder (HLAT 7B/70B shape) as single-device code.

Parallelism is applied from outside (hlat.parallel), so this file relies on two conventions:
module names are stable (tensor-parallel plans and the HF mapping target them), and head counts
are read from tensor shapes at runtime, so sharding heads across ranks needs no code change here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hlat.config.model import ModelConfig
from hlat.model.attention import AttentionMask, document_mask, sdpa
from hlat.model.kv_cache import KVCache, LayerKV
from hlat.model.ring_attention import RingContext


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear computed in its input's dtype: on CPUs the bf16 storage modes keep bf16 weights and
    fp32 activations (hlat.precision), and the weight's upcast must be part of the block's own code
    to reach inside compiled recompute regions, where torch-function modes do not apply. A no-op
    cast wherever the dtypes already agree (fp32, mixed, bf16 compute on accelerators)."""
    return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))


class Linear(nn.Linear):
    """nn.Linear computing in its input's dtype (`linear`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


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


def rope_inv_freq(cfg: ModelConfig, device: torch.device | None = None) -> torch.Tensor:
    """The RoPE inverse frequencies [head_dim // 2], scaled as transformers' rope_type
    (modeling_rope_utils: _compute_linear_scaling_rope_parameters, _compute_llama3_parameters)."""
    dim = cfg.attn_head_dim
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim)
    if cfg.rope_scaling == "linear":
        return inv_freq / cfg.rope_factor
    if cfg.rope_scaling == "llama3":
        original = cfg.rope_original_max_seq_len
        low, high = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        # long wavelengths (> original / low) are divided by the factor, short ones (< original /
        # high) kept, and those between blended linearly in original / wavelen
        scaled = torch.where(wavelen > original / low, inv_freq / cfg.rope_factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / cfg.rope_factor + smooth * scaled
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        return torch.where(medium, blended, scaled)
    return inv_freq


def rope_tables(cfg: ModelConfig, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the RoPE angles, [max_seq_len, head_dim // 2], always fp32 (bf16 angles at
    position ~4000 would be off by whole radians)."""
    positions = torch.arange(cfg.max_seq_len, dtype=torch.float32, device=device)
    angles = torch.outer(positions, rope_inv_freq(cfg, device))
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (the HF transformers convention): x [B, T, H, D], cos/sin [B|1, T, 1, D/2].
    The rotation is done in fp32 and cast back."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The SwiGLU product silu(gate) * up; standalone so selective checkpointing can target it."""
    return F.silu(gate) * up


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.attn_head_dim
        self.wq = Linear(cfg.d_model, cfg.n_heads * cfg.attn_head_dim, bias=cfg.attention_bias)
        self.wk = Linear(cfg.d_model, cfg.n_kv_heads * cfg.attn_head_dim, bias=cfg.attention_bias)
        self.wv = Linear(cfg.d_model, cfg.n_kv_heads * cfg.attn_head_dim, bias=cfg.attention_bias)
        self.wo = Linear(cfg.n_heads * cfg.attn_head_dim, cfg.d_model, bias=cfg.attention_bias)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v [B, T, heads, head_dim] before RoPE; a family that normalises q and k per head
        (Qwen3) overrides this. -1 = local head count: under tensor parallelism wq/wk/wv hold a
        slice of the heads."""
        B, T, _ = x.shape
        return (
            self.wq(x).view(B, T, -1, self.head_dim),
            self.wk(x).view(B, T, -1, self.head_dim),
            self.wv(x).view(B, T, -1, self.head_dim),
        )

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn_mask: AttentionMask, kv: LayerKV | None = None
    ) -> torch.Tensor:
        B, T, _ = x.shape
        # The tables may cover more positions than x (under sequence parallel the caller sees only
        # its shard of the sequence; x here is the gathered full sequence): keep the first T.
        cos, sin = cos[:, :T], sin[:, :T]
        q, k, v = self.heads(x)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv is not None:  # attend to the cached positions as well (rotated at their own positions)
            k, v = kv.extend(k, v)
        out = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.mlp_bias)  # gate
        self.w2 = Linear(cfg.ffn_dim, cfg.d_model, bias=cfg.mlp_bias)  # down
        self.w3 = Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.mlp_bias)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(swiglu(self.w1(x), self.w3(x)))


class TransformerBlock(nn.Module):
    attention_class: type[Attention] = Attention  # a family's own attention (hlat.model.qwen3)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attention = self.attention_class(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn_mask: AttentionMask, kv: LayerKV | None = None
    ) -> torch.Tensor:
        # kv by keyword: tensor-parallel input hooks see the four positional inputs only
        x = x + self.attention(self.attention_norm(x), cos, sin, attn_mask, kv=kv)
        return x + self.feed_forward(self.ffn_norm(x))


def _drop_tied_output(module: Llama, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    if module.output is not None and module.tok_embeddings is not None:
        state.pop(prefix + "output.weight", None)  # the embedding, saved once as tok_embeddings.weight


def _retie_after_load(module: Llama, incompatible: Any) -> None:
    module.tie_weights()  # load_state_dict(assign=True) replaced tok_embeddings.weight alone
    if "output.weight" in incompatible.missing_keys:
        incompatible.missing_keys.remove("output.weight")


class Llama(nn.Module):
    """Decoder-only LLaMA. Construction initialises the weights; it also works under
    `torch.device("meta")`, after which call `to_empty(device=...)` and `init_weights()`."""

    block_class: type[TransformerBlock] = TransformerBlock  # a family's own block (hlat.model.qwen3)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # A dict keyed by the global layer index: a pipeline stage that drops layers keeps the
        # names ("layers.40...") of the full model, so checkpoints reshard across layouts.
        self.layers = nn.ModuleDict({str(i): self.block_class(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.output = Linear(cfg.d_model, cfg.vocab_size, bias=False)
        # False on a later pipeline stage (its input is hidden states), which may still hold
        # tok_embeddings: the last stage's tied output head (hlat.parallel.pipeline.cut_stage).
        self.embeds_tokens = True
        if cfg.tie_embeddings:
            # One Parameter in both modules: named_parameters (init, optimizer) yields it once as
            # tok_embeddings.weight; the state-dict hooks keep output.weight out of checkpoints.
            self.tie_weights()
            self._register_state_dict_hook(_drop_tied_output)
            self.register_load_state_dict_post_hook(_retie_after_load)
        # Non-persistent: derived from the config, so they stay out of checkpoints.
        table_shape = (cfg.max_seq_len, cfg.attn_head_dim // 2)
        self.register_buffer("rope_cos", torch.empty(table_shape), persistent=False)
        self.register_buffer("rope_sin", torch.empty(table_shape), persistent=False)
        self.init_weights()

    def reset_rope(self) -> None:
        """Recompute the RoPE tables (non-persistent buffers: after to_empty they hold garbage)."""
        self.rope_cos, self.rope_sin = rope_tables(self.cfg, device=self.rope_cos.device)

    def tie_weights(self) -> None:
        """Make the output head the embedding matrix again (a module conversion such as to_empty
        or a dtype cast replaces each module's Parameter separately). A no-op on a pipeline stage
        that lacks either end."""
        if self.cfg.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_weights(self) -> None:
        """HLAT init of every parameter by its name (init_std_of): N(0, init_std) everywhere,
        N(0, init_std/sqrt(2L)) for wo and w2, biases 0, norms 1. A pipeline stage inits what it holds."""
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
        if name.endswith(".bias"):
            return 0.0  # biases start at zero (transformers' _init_weights)
        std = self.cfg.init_std
        if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
            # Scaled init of the projections into the residual stream (GPT-2/Megatron); L of the
            # full model, also on a pipeline stage.
            return std / math.sqrt(2 * self.cfg.n_layers)
        return std

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        # A dtype cast (model.to(torch.bfloat16)) would quantise the RoPE tables: rebuild in fp32.
        super()._apply(fn, recurse)
        self.tie_weights()
        if self.rope_cos.dtype != torch.float32:
            self.reset_rope()
        return self

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        attn_mask: AttentionMask = None,
        cache: KVCache | None = None,
        doc_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, vocab] in the compute dtype.

        positions: [B, T] token positions (default 0..T-1), e.g. reset at document starts.
        attn_mask: bool, broadcastable to [B, 1, T, T], True = may attend. It replaces the causal
        mask, so it must include causality itself (e.g. causal AND same-document); or a
        FlexAttention BlockMask (hlat.model.attention.document_mask on CUDA).
        cache: keys and values of earlier calls (incremental decoding), extended by this one; then
        `positions` and `attn_mask` ([B, 1, T, cached + T]) are required.
        doc_ids: [B, T] document numbers instead of attn_mask: the causal same-document mask is built
        here, on the run's backend (how a pipeline stage gets it: tensors split into micro-batches);
        with a RingContext as attn_mask (context parallelism in a pipeline), the whole rows' ids put
        into the ring.
        On a later pipeline stage (embeds_tokens false), `tokens` are the incoming hidden states.
        """
        if cache is not None and (positions is None or attn_mask is None):
            raise ValueError("with a KV cache, pass positions and an attn_mask over the cached and new positions")
        if positions is None:
            cos, sin = self.rope_cos[None, :, None], self.rope_sin[None, :, None]
        else:
            cos, sin = self.rope_cos[positions][:, :, None], self.rope_sin[positions][:, :, None]
        if doc_ids is not None:
            if isinstance(attn_mask, RingContext):  # a pipeline stage's ring: its micro-batch's whole rows
                attn_mask = dataclasses.replace(attn_mask, doc_ids=doc_ids)
            elif attn_mask is not None:
                raise ValueError("pass attn_mask or doc_ids, not both")
            else:
                attn_mask = document_mask(doc_ids)
        if isinstance(attn_mask, torch.Tensor) and attn_mask.dtype != torch.bool:
            raise TypeError(f"attn_mask must be bool (True = may attend), got {attn_mask.dtype}")
        h = self.tok_embeddings(tokens) if self.embeds_tokens else tokens
        for name, layer in self.layers.items():
            h = layer(h, cos, sin, attn_mask, kv=None if cache is None else cache.layer(name))
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h
