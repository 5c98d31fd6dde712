"""What a model of a configuration takes in memory, told from the configuration alone, and whether
this machine can hold it: asked before anything is allocated, so an absurd size field in a file
someone else wrote (a million layers, a billion positions) is refused instead of hanging in
allocation or exhausting the machine."""

from __future__ import annotations

import os

from hlat.config.model import ModelConfig
from hlat.model.spec import count_params


def model_bytes(cfg: ModelConfig, bytes_per_param: int) -> tuple[int, int]:
    """(the parameters' bytes, the fp32 RoPE cos and sin tables' bytes) of the model of `cfg`."""
    rope = 2 * cfg.max_seq_len * (cfg.attn_head_dim // 2) * 4
    return count_params(cfg) * bytes_per_param, rope


def machine_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB"


def memory_problem(cfg: ModelConfig, bytes_per_param: int) -> str | None:
    """None when the model fits in this machine's memory, else why not, with the figures."""
    weights, rope = model_bytes(cfg, bytes_per_param)
    total = machine_memory()
    if weights + rope <= total:
        return None
    return (
        f"the model needs {_gb(weights + rope)} ({count_params(cfg):,} parameters at {bytes_per_param} bytes "
        f"and {_gb(rope)} of RoPE tables for {cfg.max_seq_len:,} positions), more than this machine's "
        f"{_gb(total)} of memory"
    )
