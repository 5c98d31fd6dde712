"""Recompute policies measured on CPU: bytes kept for backward and the time of a training step.

For each policy (none, selective, op, op with every other matmul, full) at each shape: the bytes
one block keeps for backward and those of the whole model with its loss
(hlat.parallel.saved_activations: storages made by the forward and still alive after it), the
per-block bytes `hlat plan` predicts for the same config, and the median time of a forward +
backward of the whole model (fp32, eager), policies alternating step by step in one process so
that load drift hits all of them alike.

    python benchmarks/recompute.py --shapes 512x2,2048x1 --rounds 3 --out benchmarks/recompute.md

A shape is SEQxBATCH on the `small` preset (its max_seq_len raised to the longest sequence).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import time

import torch

from hlat.config.load import load_config
from hlat.metrics.cpu_peak import read_cpu_facts
from hlat.model import Llama
from hlat.parallel.activation_checkpoint import apply_activation_checkpoint
from hlat.parallel.loss import token_loss_sum
from hlat.parallel.saved_activations import block_bytes, model_bytes
from hlat.planning.memory import activation_bytes_per_layer

POLICIES = (("none", False), ("selective", False), ("op", False), ("op", True), ("full", False))
MIB = 1024**2


def label(policy: str, every_other: bool) -> str:
    return "op, every other mm" if every_other else policy


def step_time(model: torch.nn.Module, tokens: torch.Tensor) -> float:
    start = time.perf_counter()
    token_loss_sum(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def measure(seq: int, batch: int, rounds: int) -> list[str]:
    cfg = load_config(
        "small",
        None,
        ["--data.seq_len", str(seq), "--train.micro_batch", str(batch), "--model.max_seq_len", str(max(seq, 512))],
    )
    model_cfg = cfg.model
    tokens = torch.randint(0, model_cfg.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    models = []
    for policy, every_other in POLICIES:
        torch.manual_seed(0)
        model = Llama(model_cfg)
        apply_activation_checkpoint(model, policy, every_other)
        models.append(model)
    times: list[list[float]] = [[] for _ in POLICIES]
    for model in models:  # warm-up
        step_time(model, tokens)
    for _ in range(rounds):
        for i, model in enumerate(models):
            times[i].append(step_time(model, tokens))
    rows = [
        f"### small, seq {seq} x batch {batch} ({seq * batch} tokens, {model_cfg.n_layers} blocks)",
        "",
        "| policy | per block MiB | plan per block MiB | plan / measured | model MiB | model / none | step s (median) | step / none |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base_model = base_time = 0.0
    for (policy, every_other), ts in zip(POLICIES, times):
        block = block_bytes(model_cfg, policy, every_other, batch, seq)
        whole = model_bytes(model_cfg, policy, every_other, batch, seq)
        run = dataclasses.replace(
            cfg,
            parallel=dataclasses.replace(
                cfg.parallel, activation_checkpoint=policy, recompute_every_other_mm=every_other
            ),
        )
        planned = activation_bytes_per_layer(run, tp=1)
        median = statistics.median(ts)
        base_model, base_time = (whole, median) if policy == "none" else (base_model, base_time)
        rows.append(
            f"| {label(policy, every_other)} | {block / MIB:.1f} | {planned / MIB:.1f} | {planned / block:.3f} | "
            f"{whole / MIB:.1f} | {whole / base_model:.2f} | {median:.2f} | {median / base_time:.2f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="512x2,2048x1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    lines = [
        "# Recompute policies: bytes kept for backward and step time (CPU)",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        f"- hardware: {read_cpu_facts().model}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}",
        f"- load average at start: {os.getloadavg()[0]:.1f} (the machine is shared)",
        f"- versions: Python {platform.python_version()}, torch {torch.__version__}",
        f"- fp32, eager; step = forward + loss + backward of the whole model; {args.rounds} alternating rounds after one warm-up step",
        "",
    ]
    for shape in args.shapes.split(","):
        seq, batch = (int(x) for x in shape.split("x"))
        lines += measure(seq, batch, args.rounds) + [""]
        text = "\n".join(lines)  # written after each shape: a slow machine still leaves the first
        print(text, flush=True)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)


if __name__ == "__main__":
    main()
