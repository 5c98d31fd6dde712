"""Checkpoint size and timings for the `small` preset (fp32 weights + AdamW state): synchronous
save, async save's blocking time and total write time, load, a save by 2 data-parallel (fsdp)
ranks under torchrun (where each rank hashes its own files), a resharded load (that
checkpoint loaded into one process), and SHA-256's rate over the checkpoint's files (the
manifest's hashing). Prints a markdown table, the ratios within this run, and its conditions.

    python benchmarks/checkpoint_io.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from run_conditions import Conditions

from hlat.checkpoint.manager import CheckpointManager
from hlat.config.layout import Degrees
from hlat.config.load import load_config
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.digests import sha256_file
from hlat.optim import build_adamw
from hlat.parallel.mesh import Layout, make_layout
from hlat.parallel.parallelize import build_parallel_model
from hlat.train.optimizers import Optimizers


def build(layout: Layout, sharding: str = "ddp"):
    cfg = load_config("small")
    model = build_parallel_model(
        cfg.model,
        parallel=ParallelConfig(dp_sharding=sharding),
        layout=layout,
        device=torch.device("cpu"),
        seed=0,
        n_microbatches=1,
        precision=PrecisionConfig(mode="fp32"),
    )
    optimizers = Optimizers(model.parts, lambda part: build_adamw(part, cfg.optim))
    for p in model.parameters():  # one update with a fake gradient creates the Adam state
        p.grad = torch.ones_like(p) * 1e-3
    optimizers.step()
    optimizers.zero_grad()
    return model, optimizers


def sharded(model, optimizers) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return {"model": get_model_state_dict(model.parts[0]), "optim": optimizers.sharded_state_dict()}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--save-dp2":  # run under torchrun by the parent
        import torch.distributed as dist

        dist.init_process_group("gloo")
        model, opt = build(make_layout(Degrees(dp_shard=2), torch.device("cpu")), "fsdp")
        rank, repeats = dist.get_rank(), int(sys.argv[3])
        shared = {} if rank == 0 else None  # as the trainer does: rank 0 alone writes shared.pt
        mgr = CheckpointManager(Path(sys.argv[2]) / "async", keep_last=1)
        blocking, write = [], []
        for i in range(repeats):
            blocking.append(mgr.save(i, sharded(model, opt), {}, shared, background=True).blocking_s)
            write.append(mgr.wait().write_s)
        mgr = CheckpointManager(Path(sys.argv[2]), keep_last=1)
        sync = [timed(lambda i=i: mgr.save(i, sharded(model, opt), {}, shared)) for i in range(repeats)]
        if rank == 0:
            med = statistics.median
            print(f"DP2 {med(sync)} {med(blocking)} {med(write)}", flush=True)
        dist.barrier()
        dist.destroy_process_group()
        sys.stdout.flush()
        os._exit(0)
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    conditions = Conditions()
    single = Layout(1, 0, Degrees(), None)
    model, opt = build(single)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        mgr = CheckpointManager(Path(tmp) / "sync", keep_last=1)
        sync = [timed(lambda i=i: mgr.save(i, sharded(model, opt), {}, {})) for i in range(args.repeats)]
        path = mgr.latest()
        files = [f for f in path.rglob("*") if f.is_file()]
        size = sum(f.stat().st_size for f in files)
        hashing = [timed(lambda: [sha256_file(f) for f in files]) for _ in range(args.repeats)]
        amgr = CheckpointManager(Path(tmp) / "async", keep_last=1)
        blocking, write = [], []
        for i in range(args.repeats):
            stats = amgr.save(i, sharded(model, opt), {}, {}, background=True)
            blocking.append(stats.blocking_s)
            write.append(amgr.wait().write_s)
        load = [
            timed(lambda: (mgr.check(path), mgr.load_sharded(path, sharded(model, opt)))) for _ in range(args.repeats)
        ]
        dp2 = Path(tmp) / "dp2"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node=2",
                __file__,
                "--save-dp2",
                str(dp2),
                str(args.repeats),
            ],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        dp2_sync, dp2_blocking, dp2_write = map(
            float, next(line for line in done.stdout.splitlines() if line.startswith("DP2 ")).split()[1:]
        )
        dmgr = CheckpointManager(dp2, keep_last=1)
        dpath = dmgr.latest()
        resharded = [
            timed(lambda: (dmgr.check(dpath), dmgr.load_sharded(dpath, sharded(model, opt))))
            for _ in range(args.repeats)
        ]
    med = statistics.median
    rows = [
        ("checkpoint size (model + AdamW state)", f"{size / 2**20:.1f} MiB"),
        ("synchronous save (incl. SHA-256 manifest)", f"{med(sync):.2f} s"),
        ("async save: training blocked", f"{med(blocking):.3f} s"),
        ("async save: write + commit", f"{med(write):.2f} s"),
        ("load (verify + DCP read)", f"{med(load):.2f} s"),
        ("2 fsdp ranks: synchronous save", f"{dp2_sync:.2f} s"),
        ("2 fsdp ranks: async save, training blocked", f"{dp2_blocking:.3f} s"),
        ("2 fsdp ranks: async save, write + commit (rank 0)", f"{dp2_write:.2f} s"),
        ("resharded load (saved by 2 fsdp ranks, loaded by 1)", f"{med(resharded):.2f} s"),
        ("SHA-256 of the checkpoint's files (one process)", f"{size / med(hashing) / 1e9:.2f} GB/s"),
    ]
    params = sum(p.numel() for p in model.parameters())
    print(f"`small` preset, {params / 1e6:.1f}M parameters, fp32, 1 process unless stated, median of {args.repeats}\n")
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    print(
        f"\nsynchronous save / async save's blocking time: {med(sync) / med(blocking):.1f}x (1 process), "
        f"{dp2_sync / dp2_blocking:.1f}x (2 fsdp ranks)\n"
    )
    print("\n".join(conditions.lines()))


if __name__ == "__main__":
    main()
