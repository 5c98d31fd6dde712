"""Optimizer-step time of the bf16 AdamW against fp32 torch AdamW (fused, the default, and foreach), on the `small` preset,
and this CPU's square 1024 matmul rate in fp32 and bf16 (what docs/precision.md quotes for CPUs without native bf16).

Alternates the optimizers step by step (the CPUs are shared: ratios within one run, medians) and
writes benchmarks/precision_optimizer_step.md with the run's conditions.
Usage: python benchmarks/precision_optimizer_step.py [--steps 9]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from run_conditions import Conditions

from hlat.config.load import load_config
from hlat.metrics.gemm_ceiling import measure_gemm_tflops
from hlat.model import Llama
from hlat.optim import build_adamw, decay_groups
from hlat.precision import cast_parameters

SQUARE = (1024, 1024, 1024, False, False)  # m, k, n, transposes: the rate docs/precision.md quotes
MATMUL_DTYPES = (torch.float32, torch.bfloat16)


def with_grads(model: torch.nn.Module) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = (torch.randn(p.shape, generator=gen) * 1e-3).to(p.dtype)
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = parser.parse_args()
    conditions = Conditions()
    cfg = load_config("small")
    torch.manual_seed(0)
    fp32 = with_grads(Llama(cfg.model))
    n_params = sum(p.numel() for p in fp32.parameters())
    fp32_foreach = with_grads(Llama(cfg.model))
    candidates = {
        "fp32 torch AdamW (fused)": build_adamw(fp32, cfg.optim),
        "fp32 torch AdamW (foreach)": torch.optim.AdamW(
            decay_groups(fp32_foreach, cfg.optim),
            lr=cfg.optim.lr,
            betas=(cfg.optim.beta1, cfg.optim.beta2),
            eps=cfg.optim.eps,
            foreach=True,
        ),
        "bf16 stochastic (compiled)": build_adamw(
            with_grads(cast_parameters(Llama(cfg.model), "bf16-sr")), cfg.optim, "stochastic"
        ),
        "bf16 nearest (compiled)": build_adamw(
            with_grads(cast_parameters(Llama(cfg.model), "bf16")), cfg.optim, "nearest"
        ),
        "bf16 stochastic (eager)": build_adamw(
            with_grads(cast_parameters(Llama(cfg.model), "bf16-sr")), cfg.optim, "stochastic", compile=False
        ),
    }
    first = {}
    for name, opt in candidates.items():  # first steps: state allocation and compilation
        start = time.perf_counter()
        opt.step()
        first[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(args.steps):
        for name, opt in candidates.items():
            start = time.perf_counter()
            opt.step()
            times[name].append(time.perf_counter() - start)
    matmul = {dtype: measure_gemm_tflops(torch.device("cpu"), dtype, SQUARE, 0.2) * 1e3 for dtype in MATMUL_DTYPES}
    med = {name: statistics.median(ts) for name, ts in times.items()}
    base = med["fp32 torch AdamW (fused)"]
    lines = [
        "# Optimizer step: bf16 AdamW against fp32 AdamW",
        "",
        f"`small` preset, {n_params / 1e6:.1f}M parameters, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"median of {args.steps} alternating steps (shared CPU: compare ratios).",
        "",
        "| optimizer | first step (s) | step (s) | vs fp32 |",
        "|---|---|---|---|",
    ]
    for name, median in med.items():
        lines.append(f"| {name} | {first[name]:.2f} | {median:.3f} | {median / base:.2f}x |")
    stochastic, nearest = med["bf16 stochastic (compiled)"], med["bf16 nearest (compiled)"]
    lines += [
        "",
        f"bf16 stochastic / bf16 nearest (compiled): {stochastic / nearest:.2f}x",
        "",
        "square 1024 matmul, best of repeats for 0.2 s: "
        + ", ".join(f"{str(dtype).removeprefix('torch.')} {rate:.1f} GFLOP/s" for dtype, rate in matmul.items()),
        "",
        *conditions.lines(),
    ]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
