"""Training throughput and MFU of hlat's LLaMA against transformers' LlamaForCausalLM.

Same config (the `small` preset by default), same batch, same AdamW step, in one process; rounds
alternate between implementations so machine drift hits all of them alike. Prints a markdown
table; `--out FILE` also writes it with the hardware, versions and date.

    python benchmarks/train_throughput.py --preset small --steps 5 --rounds 3 --out benchmarks/train_throughput.md
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from collections.abc import Callable

import torch

from hlat.config import load_config
from hlat.model import Llama, count_params, flops_per_token
from hlat.parallel.loss import token_loss_sum
from hlat.model.hf import hf_config_dict
from hlat.optim import OptimConfig, build_adamw
from hlat.train.gemm_ceiling import measure_gemm_tflops, model_shapes


def make_step(model: torch.nn.Module, tokens: torch.Tensor, bf16: bool, hf: bool) -> Callable[[], None]:
    optimizer = build_adamw(model, OptimConfig())
    labels = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], -100)], dim=1)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(tokens).logits if hf else model(tokens)
        (token_loss_sum(logits, labels) / labels.numel()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bf16-steps", type=int, default=1,
                        help="timed steps per round for bf16 autocast (CPUs without native bf16 run it ~6x slower)")
    parser.add_argument("--out", help="also write the markdown report to this file")
    args = parser.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = load_config(args.preset)
    seq = cfg.data.seq_len
    tokens = torch.randint(0, cfg.model.vocab_size, (args.micro_batch, seq), generator=torch.Generator().manual_seed(0))
    flops = flops_per_token(cfg.model, seq)
    shapes = model_shapes(cfg.model.d_model, cfg.model.ffn_dim, args.micro_batch * seq)  # the model's own GEMMs
    peaks = {bf16: max(measure_gemm_tflops(torch.device("cpu"), torch.bfloat16 if bf16 else torch.float32, shape, 0.5)
                       for shape in shapes) for bf16 in (False, True)}

    runs: dict[str, Callable[[], None]] = {}
    for bf16 in (False, True):
        torch.manual_seed(0)
        runs[f"hlat Llama, {'bf16 autocast' if bf16 else 'fp32'}"] = make_step(Llama(cfg.model), tokens, bf16, hf=False)
        torch.manual_seed(0)
        hf_model = LlamaForCausalLM(LlamaConfig(**hf_config_dict(cfg.model), attn_implementation="sdpa"))
        runs[f"transformers LlamaForCausalLM, {'bf16 autocast' if bf16 else 'fp32'}"] = make_step(hf_model, tokens, bf16, hf=True)

    times: dict[str, list[float]] = {name: [] for name in runs}
    for name, step in runs.items():  # warm-up: allocator, thread pool, autocast caches
        step()
    for round_ in range(args.rounds):
        for name, step in runs.items():
            n = args.bf16_steps if "bf16" in name else args.steps
            start = time.perf_counter()
            for _ in range(n):
                step()
            times[name].append((time.perf_counter() - start) / n)
            print(f"round {round_ + 1}/{args.rounds}: {name}: {times[name][-1]:.3f} s/step", flush=True)

    tokens_per_step = args.micro_batch * seq
    lines = [
        f"| implementation | s/step (median of {args.rounds}) | tokens/s | MFU |",
        "|---|---:|---:|---:|",
    ]
    for name, samples in times.items():
        median = statistics.median(samples)
        tps = tokens_per_step / median
        peak = peaks["bf16" in name]
        lines.append(f"| {name} | {median:.3f} | {tps:,.0f} | {tps * flops / (peak * 1e12):.1%} |")
    header = [
        f"# Training throughput: `{args.preset}` preset ({count_params(cfg.model) / 1e6:.1f}M parameters)",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- hardware: {cpu_name()}, {torch.get_num_threads()} threads",
        f"- versions: Python {platform.python_version()}, torch {torch.__version__}, transformers {__import__('transformers').__version__}",
        f"- batch: {args.micro_batch} x {seq} tokens, full training step (forward, backward, clip, AdamW), "
        f"{args.steps} steps (bf16: {args.bf16_steps}) x {args.rounds} alternating rounds after one warm-up step",
        f"- MFU: {flops / 1e9:.3f} GFLOP/token (6N + 12·L·d·T) against the best GEMM rate of the model's matmul shapes measured in the same run: "
        f"fp32 {peaks[False] * 1e3:.0f} GFLOP/s, bf16 {peaks[True] * 1e3:.0f} GFLOP/s",
        "",
    ]
    report = "\n".join(header + lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(report)


if __name__ == "__main__":
    main()
