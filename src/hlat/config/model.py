"""Model architecture config. Defaults are the HLAT 7B recipe (LLaMA-2 7B shape)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from hlat.config.fields import choices


def _nearest_divisor(n: int, near: int) -> int:
    """The divisor of n closest to `near` (ties go to the larger one)."""
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: (abs(d - near), -d))


@dataclass
class ModelConfig:
    """`[model]`: the architecture (a LLaMA-style decoder; `family` picks the variant)."""

    vocab_size: int = 32000
    """Tokenizer vocabulary size (LLaMA-2's SentencePiece: 32000)."""
    d_model: int = 4096
    """Hidden size."""
    n_layers: int = 32
    """Transformer blocks."""
    n_heads: int = 32
    """Query heads."""
    n_kv_heads: int = 32
    """Key/value heads; fewer than n_heads means grouped-query attention (70B: 8)."""
    ffn_dim: int = 11008
    """SwiGLU hidden size."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    max_seq_len: int = 4096
    """The longest sequence (the length of the RoPE tables)."""
    init_std: float = 0.021
    """Weights are initialised from N(0, init_std); wo and w2 get init_std / sqrt(2 * n_layers)."""
    head_dim: int = 0
    """Width of one attention head; 0 = d_model // n_heads (the LLaMA rule)."""
    tie_embeddings: bool = False
    """The output head is the embedding matrix (SmolLM2, Llama 3.2 1B/3B)."""
    attention_bias: bool = False
    """Biases on wq, wk, wv and wo (HF attention_bias)."""
    mlp_bias: bool = False
    """Biases on w1, w2 and w3 (HF mlp_bias)."""
    rope_scaling: Literal["none", "linear", "llama3"] = "none"
    """RoPE frequency scaling, as transformers' rope_type. "none"; "linear": every frequency divided
    by rope_factor; "llama3" (Llama 3.1): low frequencies divided by rope_factor, high ones kept, a
    smooth blend between (the rope_*_freq_factor and rope_original_max_seq_len fields)."""
    rope_factor: float = 1.0
    """linear and llama3 scaling: the factor frequencies are divided by (Llama 3.1: 8.0)."""
    rope_low_freq_factor: float = 1.0
    """llama3 scaling: wavelengths over rope_original_max_seq_len / this are scaled."""
    rope_high_freq_factor: float = 4.0
    """llama3 scaling: wavelengths under rope_original_max_seq_len / this are kept."""
    rope_original_max_seq_len: int = 8192
    """llama3 scaling: the context length the model was pre-trained at."""
    family: Literal["llama", "qwen3"] = "llama"
    """The model family (hlat.model.spec; its SPECS have these keys): "llama", or "qwen3" (LLaMA
    with an RMSNorm over each query and key head before RoPE). Configs written before this field
    are LLaMA."""

    @property
    def attn_head_dim(self) -> int:
        """The width of one attention head: head_dim, or d_model // n_heads when it is 0."""
        return self.head_dim or self.d_model // self.n_heads

    def validate(self) -> list[tuple[str, str]]:
        """Every problem as (field, message with the fix); empty when the config is usable."""
        problems: list[tuple[str, str]] = []
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                problems.append((name, f"{name}={value!r} must be an integer"))
            elif value <= 0:
                problems.append((name, f"{name}={value} must be a positive integer"))
        for name in ("norm_eps", "init_std"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                problems.append((name, f"{name}={value!r} must be a finite number > 0"))
        for name in ("tie_embeddings", "attention_bias", "mlp_bias"):
            if not isinstance(getattr(self, name), bool):
                problems.append((name, f"{name}={getattr(self, name)!r} must be true or false"))
        problems += self._rope_scaling_problems()
        if self.family not in choices(ModelConfig, "family"):
            problems.append(
                ("family", f"family={self.family!r} is not one of {', '.join(choices(ModelConfig, 'family'))}")
            )
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or self.head_dim < 0:
            problems.append(
                ("head_dim", f"head_dim={self.head_dim!r} must be an integer >= 0 (0 = d_model // n_heads)")
            )
        if not isinstance(self.rope_theta, (int, float)) or not math.isfinite(self.rope_theta) or self.rope_theta <= 1:
            problems.append(
                ("rope_theta", f"rope_theta={self.rope_theta!r} must be a finite number > 1 (LLaMA uses 10000.0)")
            )
        if any(field in ("d_model", "n_heads", "n_kv_heads", "head_dim") for field, _ in problems):
            return problems  # the divisibility checks below need sane head counts

        if self.head_dim:
            if self.head_dim % 2 != 0:
                problems.append(
                    (
                        "head_dim",
                        f"head_dim={self.head_dim} is odd; RoPE rotates pairs of "
                        f"dimensions, so choose an even width such as {self.head_dim + 1}",
                    )
                )
        elif self.d_model % self.n_heads != 0:
            near = max(self.n_heads, round(self.d_model / self.n_heads) * self.n_heads)
            problems.append(
                (
                    "d_model",
                    f"d_model={self.d_model} is not divisible by "
                    f"n_heads={self.n_heads}; pick a multiple of {self.n_heads} "
                    f"such as {near}",
                )
            )
        elif self.attn_head_dim % 2 != 0:
            problems.append(
                (
                    "d_model",
                    f"head_dim = d_model/n_heads = {self.attn_head_dim} is odd; "
                    "RoPE rotates pairs of dimensions, so choose d_model and n_heads "
                    f"with an even quotient (e.g. d_model="
                    f"{self.n_heads * (self.attn_head_dim + 1)}) or set head_dim",
                )
            )
        if self.n_heads % self.n_kv_heads != 0:
            problems.append(
                (
                    "n_kv_heads",
                    f"n_heads={self.n_heads} is not divisible by "
                    f"n_kv_heads={self.n_kv_heads}; pick a divisor of {self.n_heads} "
                    f"such as {_nearest_divisor(self.n_heads, self.n_kv_heads)}",
                )
            )
        return problems

    def _rope_scaling_problems(self) -> list[tuple[str, str]]:
        if self.rope_scaling not in choices(ModelConfig, "rope_scaling"):
            return [
                (
                    "rope_scaling",
                    f"rope_scaling={self.rope_scaling!r} is not one of "
                    f"{', '.join(choices(ModelConfig, 'rope_scaling'))} (transformers' rope_type names)",
                )
            ]
        if self.rope_scaling == "none":
            return []
        problems = []
        if (
            not isinstance(self.rope_factor, (int, float))
            or not math.isfinite(self.rope_factor)
            or self.rope_factor < 1
        ):
            problems.append(
                (
                    "rope_factor",
                    f"rope_factor={self.rope_factor!r} must be a finite number "
                    f">= 1 with rope_scaling={self.rope_scaling!r} (Llama 3.1 uses 8.0)",
                )
            )
        if self.rope_scaling == "llama3":
            low, high = self.rope_low_freq_factor, self.rope_high_freq_factor
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (low, high)) or not 0 < low < high:
                problems.append(
                    (
                        "rope_high_freq_factor",
                        f"rope_low_freq_factor={low!r} and "
                        f"rope_high_freq_factor={high!r} must satisfy 0 < low < high "
                        "(Llama 3.1 uses 1.0 and 4.0)",
                    )
                )
            original = self.rope_original_max_seq_len
            if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
                problems.append(
                    (
                        "rope_original_max_seq_len",
                        f"rope_original_max_seq_len={original!r} must be a positive integer (Llama 3.1 uses 8192)",
                    )
                )
        return problems
