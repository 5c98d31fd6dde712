"""What train.deterministic costs and how accurate its sums are (docs/reproducibility.md).

Accuracy: one global batch of `--micro-batches` micro-batches of the embedded corpus through a model
of `--preset`, each micro-batch's gradient kept apart, then summed four ways and compared with their
fp64 sum: the order the default path takes on one process (each micro-batch added into .grad in
turn), its order on 4 DDP ranks (each rank adds its quarter in turn, then the ranks' sums are added,
as a ring all-reduce of 4 does for a given element), and the mode's binary tree; the gradient norm
of the default path (fp32 per tensor, then over tensors) against the mode's fp64 row sums.

Cost: `hlat train` of `--preset` for `--steps` steps, with and without the mode, on one process
(accumulating all micro-batches) and on 2 (DDP and FSDP2): the median seconds a step after the
first and the peak memory per process (metrics.jsonl); and what train.replay_every costs.

    python benchmarks/deterministic.py --out benchmarks/deterministic.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from run_conditions import Conditions

from hlat.config.load import load_config
from hlat.parallel.ordered_sum import CanonicalNorm, tree_sum
from hlat.parallel.parallelize import global_target_count
from hlat.train.trainer import Trainer

MODEL = ["--model.d_model", "256", "--model.n_layers", "4", "--model.n_heads", "4", "--model.ffn_dim", "768"]
COMMON = [
    *MODEL, "--data.seq_len", "128", "--train.micro_batch", "2", "--train.log_every", "1",
    "--train.tensorboard", "false", "--train.plot", "false", "--train.sample_prompt", "", "--eval.every", "0",
    "--parallel.compile", "false", "--precision.mode", "fp32", "--train.peak_tflops", "1",
]  # fmt: skip


def micro_batch_grads(preset: str, n: int, scratch: Path) -> list[list[torch.Tensor]]:
    """Each of `n` micro-batches' gradients (the loss share each has in the global mean)."""
    cfg = load_config(
        preset, None, [*COMMON, "--train.global_batch", str(2 * n), "--train.run_dir", str(scratch / "grads")]
    )
    trainer = Trainer(cfg, resume="fresh", out=lambda line: None)
    batches = trainer.data.read()
    n_targets = global_target_count(batches, trainer.layout)
    grads = []
    for _ in trainer.model.backward_each(batches, n_targets):  # each micro-batch's gradient alone
        grads.append([p.grad.detach().clone() for p in trainer.model.parameters()])
    trainer.data.close()
    return grads


def errors(found: list[torch.Tensor], exact: list[torch.Tensor]) -> tuple[float, float]:
    """(largest absolute error, relative L2 error) of `found` against `exact` (fp64)."""
    diff = torch.cat([(f.double() - e).reshape(-1) for f, e in zip(found, exact)])
    scale = torch.cat([e.reshape(-1) for e in exact]).norm()
    return diff.abs().max().item(), (diff.norm() / scale).item()


def accuracy(preset: str, n: int, scratch: Path) -> list[str]:
    grads = micro_batch_grads(preset, n, scratch)
    tensors = range(len(grads[0]))
    exact = [sum(g[t].double() for g in grads) for t in tensors]

    def sequential(parts: list[torch.Tensor]) -> torch.Tensor:
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        return total

    ranks = 4
    quarter = n // ranks
    ways = {
        "default, 1 process (micro-batches added in turn)": [sequential([g[t] for g in grads]) for t in tensors],
        f"default, {ranks} DDP ranks (each rank's {quarter} in turn, then the ranks' sums)": [
            sequential([sequential([g[t] for g in grads[r * quarter : (r + 1) * quarter]]) for r in range(ranks)])
            for t in tensors
        ],
        "train.deterministic (binary tree in global order)": [tree_sum([g[t] for g in grads]) for t in tensors],
    }
    lines = [
        f"One global batch of {n} micro-batches of 2 x 128 tokens, `{preset}` preset with `{' '.join(MODEL)}`; the "
        "error of each sum against the fp64 sum of the same fp32 micro-batch gradients:",
        "",
        "| sum | largest absolute error | relative L2 error |",
        "|---|---|---|",
    ]
    for name, found in ways.items():
        largest, relative = errors(found, exact)
        lines.append(f"| {name} | {largest:.3g} | {relative:.3g} |")
    exact_norm = torch.cat([e.reshape(-1) for e in exact]).norm().item()
    summed = ways["default, 1 process (micro-batches added in turn)"]
    default_norm = torch.nn.utils.get_total_norm(summed, foreach=True).item()
    mode_norm = CanonicalNorm(None)(summed).item()
    lines += [
        "",
        f"Gradient norm of the same fp32 gradient against its fp64 norm ({exact_norm:.9g}): the default "
        f"path's (fp32 per tensor, then over tensors) is {abs(default_norm - exact_norm) / exact_norm:.3g} "
        f"off, the mode's (fp64 row sums, one fp64 sum) {abs(mode_norm - exact_norm) / exact_norm:.3g} "
        "(both rounded to fp32 at the end).",
    ]
    return lines


def run(preset: str, steps: int, nproc: int, threads: int, extra: list[str], run_dir: Path) -> tuple[float, float]:
    """(median s/step after the first, peak GiB per process) of one `hlat train` whose processes
    start with `threads` intra-op threads (the mode then runs one)."""
    args = [*COMMON, "--train.steps", str(steps), "--train.run_dir", str(run_dir), *extra]
    launcher = [] if nproc == 1 else ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    command = [sys.executable, *launcher, "-m", "hlat", "train", "--preset", preset, *args]
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "loss" in r]
    return statistics.median(r["step_s"] for r in records[1:]), max(r["mem_peak_gib"] for r in records)


def cost(preset: str, steps: int, batch: int, scratch: Path) -> list[str]:
    lines = [
        "",
        f"`hlat train --preset {preset} {' '.join(MODEL)}`, global batch {batch} x 128 tokens in micro-batches of 2, "
        f"{steps} steps, fp32, eager; median seconds a step after the first, peak memory per process "
        "(the mode runs one intra-op thread whatever a process starts with):",
        "",
        "| layout | default s/step | deterministic s/step | ratio | default GiB | deterministic GiB |",
        "|---|---|---|---|---|---|",
    ]
    cores = os.cpu_count() or 1
    replay = ["--train.global_batch", str(batch), "--train.deterministic", "true", "--train.replay_every"]
    for name, nproc, threads, extra in (
        (f"1 process, {cores} threads", 1, cores, []),
        ("1 process, 1 thread", 1, 1, []),
        ("dp 2, DDP", 2, max(1, cores // 2), []),
        ("dp 2, FSDP2", 2, max(1, cores // 2), ["--parallel.dp_sharding", "fsdp"]),
    ):
        found = {}
        for mode in ("false", "true"):
            found[mode] = run(
                preset,
                steps,
                nproc,
                threads,
                ["--train.global_batch", str(batch), "--train.deterministic", mode, *extra],
                scratch / f"{name}-{mode}".replace(" ", "_").replace(",", ""),
            )
        (ds, dm), (ts, tm) = found["false"], found["true"]
        lines.append(f"| {name} | {ds:.3f} | {ts:.3f} | {ts / ds:.2f} | {dm:.2f} | {tm:.2f} |")
    plain, _ = run(preset, steps, 2, max(1, cores // 2), [*replay, "0"], scratch / "replay-0")
    every, _ = run(preset, steps, 2, max(1, cores // 2), [*replay, "1"], scratch / "replay-1")
    per_replay = every - plain
    lines += [
        "",
        f"Replay on dp 2 (DDP), deterministic: {plain:.3f} s a step without it, {every:.3f} s replaying every "
        f"step, so one replay costs {per_replay:.3f} s (a micro-batch recomputed, its digest, three small "
        f"gathers): {per_replay / 100 / plain:.2%} of the step time at train.replay_every 100.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--micro-batches", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the mode's own setting: the accuracy part's gradients as the mode computes them
    conditions = Conditions()
    with tempfile.TemporaryDirectory() as scratch:
        lines = accuracy(args.preset, args.micro_batches, Path(scratch))
        lines += cost(args.preset, args.steps, 2 * args.micro_batches, Path(scratch))
    text = "\n".join(["# train.deterministic: accuracy and cost", "", *lines, "", *conditions.lines(), ""])
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
