"""Shared by the resume and fault tests: one tiny model's command-line settings, and launchers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save


def tiny_args(corpus: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        "--data.source", str(corpus), "--model.vocab_size", "512", "--model.d_model", "64", "--model.n_layers", "2",
        "--model.n_heads", "4", "--model.n_kv_heads", "2", "--model.ffn_dim", "128", "--model.max_seq_len", "64",
        "--data.seq_len", "32", "--train.global_batch", "8", "--train.micro_batch", "2", "--train.log_every", "1",
        "--precision.mode", "fp32", "--train.tensorboard", "false", "--train.peak_tflops", "1", "--eval.every", "0",
        "--schedule.warmup_steps", "2", "--schedule.decay_steps", "6", "--train.run_dir", str(run_dir), *extra,
    ]


def launch(nproc: int, args: list[str], env: dict[str, str] | None = None, script: Path | None = None,
           restarts: int = 0) -> subprocess.CompletedProcess:
    """`hlat train ARGS` (or a script) under torchrun with `nproc` gloo processes; must succeed."""
    target = [str(script)] if script else ["-m", "hlat", "train"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           f"--max-restarts={restarts}", *target, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def checkpoint_tensors(checkpoint: Path, scratch: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's DCP data as full tensors, flattened to dotted keys."""
    file = scratch / f"{checkpoint.parent.parent.name}-{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint / "dcp", file)
    out: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, torch.Tensor):
            out[prefix] = value

    walk("", torch.load(file, weights_only=False))
    return out


def assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
