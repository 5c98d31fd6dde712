"""Start-up time (model build + parameter init) of the `1b` preset under FSDP on 2 CPU ranks, for
the initialisation before and after it moved to each shard (hlat.parallel.init), in one launch:

    torchrun --standalone --nproc_per_node 2 benchmarks/init_startup.py [--baseline REV]

- before: src/hlat/parallel/init.py as of REV (every rank draws each full tensor on the host with
  torch.Generator.normal_ and keeps its shard);
- after: each rank hashes its own elements (hlat.parallel.init_values), eager torch ops.

Each row is the slowest rank's wall time; `init` is the time inside init_parameters. The layout-independence of the "after" values is tested in tests/model/test_init.py. Then rank 0
times the value function alone on 2^20 elements, one thread: ns per element.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import time
import types
from pathlib import Path

import torch
import torch.distributed as dist

import hlat.parallel.parallelize as parallelize
from hlat.config.layout import Degrees
from hlat.config.load import load_config
from hlat.config.parallel import ParallelConfig
from hlat.model import count_params
from hlat.parallel import init
from hlat.parallel.init_values import init_values, parameter_key, value_scale
from hlat.parallel.mesh import make_layout

REPO = Path(__file__).resolve().parents[1]
BASELINE = "8389481df25ac640ba2e32d33a47418f6d72325c"  # the last commit that drew every full tensor on the host


def old_init(rev: str) -> types.ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:src/hlat/parallel/init.py"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType("hlat_init_before")
    exec(compile(source, f"{rev}:src/hlat/parallel/init.py", "exec"), module.__dict__)
    return module


def start_up(cfg, layout, init_fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(build + init s, init s), this rank."""
    spent = [0.0]

    def timed_init(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        init_fn(*args, **kwargs)
        spent[0] += time.perf_counter() - start

    parallelize.init_parameters = timed_init
    dist.barrier()
    start = time.perf_counter()
    model = parallelize.build_parallel_model(
        cfg.model,
        parallel=ParallelConfig(dp_sharding="fsdp"),
        layout=layout,
        device=torch.device("cpu"),
        seed=0,
        n_microbatches=1,
        precision=cfg.precision,
    )
    total = time.perf_counter() - start
    del model
    gc.collect()
    return total, spent[0]


def slowest(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def per_element_ns() -> list[tuple[str, float]]:
    n = 1 << 20
    rows, inner, stride = torch.arange(n // 1024), torch.arange(1024), 1024
    k0, k1 = parameter_key(0, "layers.0.attention.wq.weight")
    scale = value_scale(0.02)
    out, gen = torch.empty(n), torch.Generator().manual_seed(0)
    cases = [
        ("before: Generator.normal_", lambda: out.normal_(0.0, 0.02, generator=gen)),
        ("after", lambda: init_values(rows, inner, stride, k0, k1, scale)),
    ]
    result = []
    for name, fn in cases:
        fn()
        start = time.perf_counter()
        for _ in range(5):
            fn()
        result.append((name, (time.perf_counter() - start) / 5 / n * 1e9))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", default=BASELINE, help="git revision whose init.py is 'before'")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    layout = make_layout(Degrees(dp_shard=dist.get_world_size()), torch.device("cpu"))
    cfg = load_config("1b")
    before = old_init(args.baseline)
    modes = [
        ("before (host draw, full tensors)", before.init_parameters),
        ("after (each rank its shard)", init.init_parameters),
    ]
    rows = []
    for name, fn in modes:
        total, init_s = start_up(cfg, layout, fn)
        rows.append((name, slowest(total), slowest(init_s)))
    if rank == 0:
        params = count_params(cfg.model)
        print(
            f"`1b` preset ({params / 1e9:.2f}B parameters, {cfg.precision.mode} precision: fp32 weights), FSDP over "
            f"{dist.get_world_size()} CPU ranks (gloo), torch {torch.__version__}, "
            f"{torch.get_num_threads()} thread(s) per rank, slowest rank\n"
        )
        print("| initialisation | build + init | init |\n|---|---|---|")
        for name, total, init_s in rows:
            print(f"| {name} | {total:.1f} s | {init_s:.1f} s |")
        print()
        torch.set_num_threads(1)
        print("| values of 2^20 elements, 1 thread | ns / element |\n|---|---|")
        for name, ns in per_element_ns():
            print(f"| {name} | {ns:.1f} |")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
