"""Would fusing hlat's projections pay? Separate q/k/v and gate/up linears against one fused linear
each, forward and backward, at a preset's shapes (one micro-batch of rows), on this machine's CPU.

hlat keeps separate weights (they map one to one onto Hugging Face's and shard under TP without
re-interleaving); this measures what fusing would gain, interleaving the variants so that drift
hits both. `--out FILE` writes the markdown report.

    python benchmarks/fused_projections.py --presets small,1b --out benchmarks/fused_projections.md
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hlat.config.load import load_config
from hlat.metrics.cpu_peak import read_cpu_facts


def timed_pair(separate: list[torch.Tensor], fused: torch.Tensor, x: torch.Tensor, rounds: int) -> tuple[float, float]:
    """Median seconds of forward + backward of the separate linears and of the fused one."""

    def run_separate() -> None:
        torch.stack([F.linear(x, w).sum() for w in separate]).sum().backward()

    def run_fused() -> None:
        F.linear(x, fused).sum().backward()

    variants: list[Callable[[], None]] = [run_separate, run_fused]
    for run in variants:  # warm-up
        run()
    times: list[list[float]] = [[], []]
    for round_ in range(rounds):
        for i in (0, 1) if round_ % 2 == 0 else (1, 0):
            start = time.perf_counter()
            variants[i]()
            times[i].append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="small,1b")
    parser.add_argument("--rows", type=int, default=4096, help="tokens in the micro-batch")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out")
    args = parser.parse_args()
    lines = [
        "# Fused projections: separate linears against one fused linear (forward + backward)",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- hardware: {read_cpu_facts().model}, {torch.get_num_threads()} threads, torch CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}",
        f"- versions: Python {platform.python_version()}, torch {torch.__version__}",
        f"- method: fp32, {args.rows} rows, {args.rounds} rounds alternating the variants, medians; "
        "each output summed (the loss stand-in); a fused layer's consumer splits its output by views, so neither side copies",
        "",
        "| preset | projections | weight shapes | separate ms | fused ms | fused saves |",
        "|---|---|---|---:|---:|---:|",
    ]
    for preset in args.presets.split(","):
        m = load_config(preset).model
        head = m.head_dim or m.d_model // m.n_heads
        shapes = {
            "q, k, v": [m.n_heads * head, m.n_kv_heads * head, m.n_kv_heads * head],
            "gate, up": [m.ffn_dim, m.ffn_dim],
        }
        x = torch.randn(args.rows, m.d_model, requires_grad=True)
        for name, outs in shapes.items():
            separate = [torch.randn(n, m.d_model, requires_grad=True) for n in outs]
            fused = torch.randn(sum(outs), m.d_model, requires_grad=True)
            sep, fus = timed_pair(separate, fused, x, args.rounds)
            lines.append(
                f"| {preset} | {name} | {' + '.join(f'{n}x{m.d_model}' for n in outs)} | "
                f"{sep * 1e3:.1f} | {fus * 1e3:.1f} | {1 - fus / sep:.0%} |"
            )
            print(lines[-1], flush=True)
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(report)


if __name__ == "__main__":
    main()
