"""Training throughput and peak memory per rank of the `small` preset under each data/tensor
parallel layout on 2 processes, against 1 process, in one run of this script.

    python benchmarks/parallel_throughput.py --steps 4 --out benchmarks/parallel_throughput.md

Each layout is one torchrun launch of this file in worker mode (gloo on CPU, 1 thread per process;
the 1-process baseline gets 2 threads, so both use the machine's 2 cores). Timed steps follow two
warm-up steps; peak memory is each process's peak resident set size (includes the ~0.4 GB of the
Python and torch runtime), and the training-state bytes are counted from the local tensors.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAYOUTS = [  # (label, processes, tp, dp_sharding)
    ("1 process", 1, 1, "ddp"),
    ("DDP x2", 2, 1, "ddp"),
    ("ZeRO-1 x2", 2, 1, "zero1"),
    ("FSDP2 x2", 2, 1, "fsdp"),
    ("TP 2", 2, 2, "ddp"),
]


def worker(out: Path, tp: int, sharding: str, steps: int, micro_batch: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from hlat.config.load import load_config
    from hlat.config.parallel import ParallelConfig
    from hlat.config.precision import PrecisionConfig
    from hlat.data.batch import Batch, labels_for
    from hlat.dtensor import local_tensor
    from hlat.optim import build_adamw, decay_groups
    from hlat.parallel.mesh import setup, teardown
    from hlat.parallel.parallelize import build_parallel_model
    from hlat.train.optimizers import Optimizers
    from hlat.train.step import train_step

    cfg = load_config("small")
    par = ParallelConfig(tp=tp, dp_sharding=sharding)
    layout = setup(par, torch.device("cpu"))
    model = build_parallel_model(
        cfg.model,
        parallel=par,
        layout=layout,
        device=torch.device("cpu"),
        seed=0,
        n_microbatches=1,
        precision=PrecisionConfig(mode="fp32"),
    )
    o = cfg.optim

    def build(part):  # type: ignore[no-untyped-def]
        if sharding == "zero1" and layout.dp > 1:
            return ZeroRedundancyOptimizer(
                decay_groups(part, o),
                optimizer_class=torch.optim.AdamW,
                process_group=layout.group("dp"),
                lr=o.lr,
                betas=(o.beta1, o.beta2),
                eps=o.eps,
                foreach=True,
            )
        return build_adamw(part, o)

    optimizers = Optimizers(model.parts, build)
    seq = cfg.data.seq_len
    gen = torch.Generator().manual_seed(layout.dp_rank)
    tokens = torch.randint(0, cfg.model.vocab_size, (micro_batch, seq), generator=gen)
    batch = Batch(tokens, labels_for(tokens))
    for step in range(2 + steps):
        if step == 2:
            if layout.world > 1:
                dist.barrier()
            start = time.perf_counter()
        rank_loss, _ = train_step(model, optimizers, [batch], cfg.optim.grad_clip)
    loss = model.reduce_loss(rank_loss).item()
    elapsed = time.perf_counter() - start
    state = sum(local_tensor(t).nbytes for t in model.parameters()) * 2  # weights + grads
    for opt in optimizers.optimizers:
        local = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps its shard's optimizer here
        state += sum(
            local_tensor(v).nbytes
            for s in local.state.values()
            for v in s.values()
            if hasattr(v, "nbytes") and v.ndim > 0
        )
    record = {
        "rank": layout.rank,
        "tokens_per_s": steps * micro_batch * seq * layout.dp / elapsed,
        "loss": loss,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "state_gib": state / 2**30,
    }
    (out / f"rank{layout.rank}.json").write_text(json.dumps(record))
    teardown()
    sys.stdout.flush()
    os._exit(0)


def launch(label: str, nproc: int, tp: int, sharding: str, steps: int, micro_batch: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            str(Path(__file__).resolve()),
            "--worker",
            tmp,
            "--tp",
            str(tp),
            "--sharding",
            sharding,
            "--steps",
            str(steps),
            "--micro-batch",
            str(micro_batch),
        ]
        if nproc == 1:
            cmd, threads = [sys.executable, *args], "2"
        else:
            cmd, threads = (
                [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args],
                "1",
            )
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": threads})
        if done.returncode != 0:
            raise RuntimeError(f"{label} failed:\n{done.stderr[-3000:]}")
        return [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per data-parallel rank per step")
    parser.add_argument("--out")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--sharding", default="ddp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.worker), args.tp, args.sharding, args.steps, args.micro_batch)
        return
    import torch

    rows = [
        "| layout | processes | tokens/s (all ranks) | peak RSS per rank (GiB) | weights+grads+Adam per rank (GiB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, nproc, tp, sharding in LAYOUTS:
        records = launch(label, nproc, tp, sharding, args.steps, args.micro_batch)
        tps = records[0]["tokens_per_s"]
        rss = max(r["peak_rss_gib"] for r in records)
        state = max(r["state_gib"] for r in records)
        print(f"{label}: {tps:,.0f} tokens/s, peak RSS {rss:.2f} GiB, state {state:.3f} GiB", flush=True)
        rows.append(f"| {label} | {nproc} | {tps:,.0f} | {rss:.2f} | {state:.3f} |")
    report = (
        "\n".join(
            [
                "# Parallel layouts: `small` preset on one machine",
                "",
                f"- date: {datetime.date.today().isoformat()}",
                f"- hardware: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; gloo backend, fp32",
                f"- versions: Python {platform.python_version()}, torch {torch.__version__}",
                f"- {args.steps} timed steps after 2 warm-up steps; {args.micro_batch} x 512 tokens per data-parallel rank per step "
                "(TP 2 is one data-parallel rank: half the tokens per step of the other 2-process layouts)",
                "",
                *rows,
            ]
        )
        + "\n"
    )
    print(report)
    if args.out:
        Path(args.out).write_text(report)


if __name__ == "__main__":
    main()
