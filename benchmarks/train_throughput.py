"""Training throughput of hlat as a user gets it (compiled by default) against transformers'
LlamaForCausalLM, eager and compiled, and against the machine's own GEMM rate.

Same config, same batch, same fp32 AdamW step, in one process; rounds alternate between the
implementations step by step so that machine drift hits all of them alike. Each config's table
gives tokens/s, the ratio to transformers eager, and hlat's model FLOP/s as a fraction of the best
GEMM rate of the model's own matmul shapes, timed in every round between the implementations
(median over rounds), so that the rate it is compared with is the machine's in that same window.
`--out FILE` writes the report with the hardware, versions and date. Whole `hlat train` runs as a
user launches them: benchmarks/train_runs.py.

    python benchmarks/train_throughput.py --configs small:8192,small --out benchmarks/train_throughput.md

A config is PRESET or PRESET:VOCAB (the preset with another vocabulary size).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from collections.abc import Callable

import torch

from hlat.config.data import DataConfig
from hlat.config.load import load_config
from hlat.config.optim import OptimConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.config.train import TrainConfig
from hlat.metrics.cpu_peak import read_cpu_facts
from hlat.metrics.gemm_ceiling import measure_gemm_tflops, model_shapes
from hlat.model import Llama, count_params, flops_per_token
from hlat.model.hf import hf_config_dict
from hlat.optim import build_adamw
from hlat.parallel.compile import compile_blocks, decide_compile
from hlat.parallel.loss import token_loss_sum

CPU = torch.device("cpu")
COMPILED_HF = "transformers, each decoder layer compiled"
GEMM = "GEMM rate"


def make_step(model: torch.nn.Module, tokens: torch.Tensor, hf: bool) -> Callable[[], None]:
    optimizer = build_adamw(model, OptimConfig())
    labels = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], -100)], dim=1)

    def step() -> None:
        logits = model(tokens).logits if hf else model(tokens)
        (token_loss_sum(logits, labels) / labels.numel()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def implementations(
    spec: str, micro_batch: int
) -> tuple[str, dict[str, Callable[[], None]], float, Callable[[], float], int]:
    """(title, steps by name, FLOPs per token, a GEMM-rate measurement in TFLOP/s, tokens per step) of one config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    preset, _, vocab = spec.partition(":")
    cfg = load_config(preset, None, ["--model.vocab_size", vocab] if vocab else [])
    seq = cfg.data.seq_len
    tokens = torch.randint(0, cfg.model.vocab_size, (micro_batch, seq), generator=torch.Generator().manual_seed(0))
    decision = decide_compile(
        model=cfg.model,
        parallel=ParallelConfig(compile="auto"),
        precision=PrecisionConfig(mode="fp32"),
        train=TrainConfig(micro_batch=micro_batch),
        data=DataConfig(seq_len=seq, document_masking=False),
        device=CPU,
    )
    print(f"{spec}: hlat default {decision.line}", flush=True)

    def hlat(compiled: bool) -> Callable[[], None]:
        torch.manual_seed(0)
        model = Llama(cfg.model)
        if compiled:
            compile_blocks(model, "cpu")
        return make_step(model, tokens, hf=False)

    def transformers(compiled: bool) -> Callable[[], None]:
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**hf_config_dict(cfg.model), attn_implementation="sdpa"))
        if compiled:
            for i, layer in enumerate(model.model.layers):
                model.model.layers[i] = torch.compile(layer)
        return make_step(model, tokens, hf=True)

    runs = {
        f"hlat default ({'compiled' if decision.enabled else 'eager'})": hlat(decision.enabled),
        "hlat eager": hlat(False),
        "transformers eager": transformers(False),
        COMPILED_HF: transformers(True),
    }
    shapes = model_shapes(cfg.model.d_model, cfg.model.ffn_dim, micro_batch * seq)[:3]  # the model's own GEMMs
    gemm = lambda: max(measure_gemm_tflops(CPU, torch.float32, shape, 1.0) for shape in shapes)
    title = f"`{spec}`: {count_params(cfg.model) / 1e6:.1f}M parameters, batch {micro_batch} x {seq}"
    return title, runs, flops_per_token(cfg.model, seq), gemm, micro_batch * seq


def time_rounds(
    runs: dict[str, Callable[[], None]], gemm: Callable[[], float], steps: int, rounds: int
) -> tuple[dict[str, list[float]], list[float]]:
    """Seconds per step of each implementation, one sample per round, and the GEMM rate (TFLOP/s)
    measured once per round among them. Each round starts one later in the order, so that no
    implementation always follows the GEMM timing or the same neighbour."""
    for step in runs.values():  # warm-up: compilation, allocator, thread pool
        step()
        step()
    times: dict[str, list[float]] = {name: [] for name in runs}
    rates: list[float] = []
    order = [GEMM, *runs]
    for round_ in range(rounds):
        shift = round_ % len(order)
        for name in order[shift:] + order[:shift]:
            if name == GEMM:
                rates.append(gemm())
                print(f"  round {round_ + 1}/{rounds}: GEMM rate {rates[-1] * 1e3:.0f} GFLOP/s", flush=True)
                continue
            start = time.perf_counter()
            for _ in range(steps):
                runs[name]()
            times[name].append((time.perf_counter() - start) / steps)
            print(f"  round {round_ + 1}/{rounds}: {name}: {times[name][-1]:.3f} s/step", flush=True)
    return times, rates


def table(title: str, times: dict[str, list[float]], flops: float, rates: list[float], tokens: int) -> list[str]:
    eager, compiled = (tokens / statistics.median(times[name]) for name in ("transformers eager", COMPILED_HF))
    gemm = statistics.median(rates)
    lines = [
        f"### {title}, GEMM rate of its matmul shapes {gemm * 1e3:.0f} GFLOP/s (median of the rounds; "
        f"{min(rates) * 1e3:.0f}-{max(rates) * 1e3:.0f})",
        "",
        "| implementation | s/step (median) | tokens/s | vs transformers eager | vs transformers compiled | "
        "model FLOP/s / GEMM rate |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, samples in times.items():
        tps = tokens / statistics.median(samples)
        lines.append(
            f"| {name} | {statistics.median(samples):.3f} | {tps:,.0f} | {tps / eager:.2f}x | "
            f"{tps / compiled:.2f}x | {tps * flops / (gemm * 1e12):.0%} |"
        )
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="small:8192,small", help="comma-separated PRESET or PRESET:VOCAB")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per implementation per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", help="also write the markdown report to this file")
    args = parser.parse_args()

    body: list[str] = []
    for spec in args.configs.split(","):
        title, runs, flops, gemm, tokens = implementations(spec, args.micro_batch)
        times, rates = time_rounds(runs, gemm, args.steps, args.rounds)
        body += table(title, times, flops, rates, tokens)
    header = [
        "# Training throughput: hlat's default against transformers",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- hardware: {read_cpu_facts().model}, {torch.get_num_threads()} threads, torch CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}",
        f"- versions: Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {__import__('transformers').__version__}",
        f"- method: full fp32 training step (forward, backward, clip, AdamW) in one process; two warm-up steps each, "
        f"then {args.rounds} rounds alternating the implementations, {args.steps} steps each, each round starting one later in the order; medians",
        "- model FLOP/s: 6N + 12·L·d·T per token (causal attention not halved), divided by the best rate of the model's "
        "own GEMMs (x·Wᵀ, g·W, gᵀ·x of the feed-forward, timed 1 s each once per round, its place in the round rotating with the implementations'; median over rounds)",
        "",
    ]
    report = "\n".join(header + body)
    print(report)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(report)


if __name__ == "__main__":
    main()
