"""Model architecture config. Defaults are the HLAT 7B recipe (LLaMA-2 7B shape)."""

from __future__ import annotations

import math
from dataclasses import dataclass


def _nearest_divisor(n: int, near: int) -> int:
    """The divisor of n closest to `near` (ties go to the larger one)."""
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: (abs(d - near), -d))


@dataclass
class ModelConfig:
    vocab_size: int = 32000  # tokenizer vocabulary (LLaMA-2 SentencePiece: 32000)
    d_model: int = 4096  # hidden size
    n_layers: int = 32  # transformer blocks
    n_heads: int = 32  # query heads
    n_kv_heads: int = 32  # key/value heads; < n_heads means grouped-query attention (70B: 8)
    ffn_dim: int = 11008  # SwiGLU hidden size
    norm_eps: float = 1e-5  # RMSNorm epsilon
    rope_theta: float = 10000.0  # RoPE base frequency
    max_seq_len: int = 4096  # longest sequence (length of the RoPE tables)
    init_std: float = 0.021  # N(0, init_std) init; wo and w2 get init_std / sqrt(2 * n_layers)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def validate(self) -> list[tuple[str, str]]:
        """Every problem as (field, message with the fix); empty when the config is usable."""
        problems: list[tuple[str, str]] = []
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim",
                     "max_seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                problems.append((name, f"{name}={value!r} must be an integer"))
            elif value <= 0:
                problems.append((name, f"{name}={value} must be a positive integer"))
        for name in ("norm_eps", "init_std"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                problems.append((name, f"{name}={value!r} must be a finite number > 0"))
        if not isinstance(self.rope_theta, (int, float)) or not math.isfinite(self.rope_theta) \
                or self.rope_theta <= 1:
            problems.append(("rope_theta", f"rope_theta={self.rope_theta!r} must be a finite "
                             "number > 1 (LLaMA uses 10000.0)"))
        if any(field in ("d_model", "n_heads", "n_kv_heads") for field, _ in problems):
            return problems  # the divisibility checks below need sane head counts

        if self.d_model % self.n_heads != 0:
            near = max(self.n_heads, round(self.d_model / self.n_heads) * self.n_heads)
            problems.append(("d_model", f"d_model={self.d_model} is not divisible by "
                             f"n_heads={self.n_heads}; pick a multiple of {self.n_heads} "
                             f"such as {near}"))
        elif self.head_dim % 2 != 0:
            problems.append(("d_model", f"head_dim = d_model/n_heads = {self.head_dim} is odd; "
                             "RoPE rotates pairs of dimensions, so choose d_model and n_heads "
                             f"with an even quotient (e.g. d_model="
                             f"{self.n_heads * (self.head_dim + 1)})"))
        if self.n_heads % self.n_kv_heads != 0:
            problems.append(("n_kv_heads", f"n_heads={self.n_heads} is not divisible by "
                             f"n_kv_heads={self.n_kv_heads}; pick a divisor of {self.n_heads} "
                             f"such as {_nearest_divisor(self.n_heads, self.n_kv_heads)}"))
        return problems
