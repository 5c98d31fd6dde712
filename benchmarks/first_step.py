"""What the gradient clip and AdamW step cost on DTensor layouts: torch's DTensor ops against
hlat's shard-wise ones (hlat.parallel.grad_norm, hlat.optim.adamw.ShardwiseAdamW).

For each layout (FSDP2 dp 2, TP 2, FSDP2 dp 2 x TP 2) the script runs itself under torchrun: it
builds a LLaMA of `--layers` blocks as training does, runs one forward and backward, and then times
`clip + step` on this rank's CPU clock, twice per implementation: the first call, which pays
DTensor's sharding-propagation plans, and the second, which reads them from its cache. Each
implementation starts from cleared caches and its own copy of the gradients.

    python benchmarks/first_step.py --out benchmarks/first_step.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from run_conditions import Conditions
from torch.distributed.tensor._redistribute import clear_redistribute_planner_cache
from torch.distributed.tensor.debug import _clear_sharding_prop_cache

from hlat.config.layout import Degrees
from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import Batch, labels_for
from hlat.dtensor import full_tensor
from hlat.optim.adamw import ShardwiseAdamW
from hlat.parallel.mesh import make_layout
from hlat.parallel.parallelize import build_parallel_model

LAYOUTS = {  # name: (world, degrees, dp_sharding)
    "fsdp dp2": (2, Degrees(dp_shard=2), "fsdp"),
    "tp2": (2, Degrees(tp=2), "ddp"),
    "fsdp dp2 x tp2": (4, Degrees(dp_shard=2, tp=2), "fsdp"),
}


def torch_clip_step(model, optimizer) -> torch.Tensor:
    """The path before: torch's norm, clip and AdamW, each dispatched through DTensor."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = full_tensor(torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True))
    torch.nn.utils.clip_grads_with_norm_(params, 1.0, norm, foreach=True)
    optimizer.step()
    return norm


def hlat_clip_step(model, optimizer) -> torch.Tensor:
    norm = model.clip_grad_norm_(1.0)
    optimizer.step()
    return norm


def worker(layers: int, layout_name: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    _, degrees, sharding = LAYOUTS[layout_name]
    layout = make_layout(degrees, torch.device("cpu"))
    cfg = ModelConfig(vocab_size=512, d_model=64, n_layers=layers, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
    par = ParallelConfig(tp=degrees.tp, dp=layout.dp, dp_sharding=sharding)
    model = build_parallel_model(
        cfg, parallel=par, layout=layout, device=torch.device("cpu"), seed=0, n_microbatches=1,
        precision=PrecisionConfig(mode="fp32"),
    )  # fmt: skip
    tokens = torch.randint(0, cfg.vocab_size, (2, 64), generator=torch.Generator().manual_seed(layout.dp_rank))
    model.forward_backward([Batch(tokens, labels_for(tokens))], torch.tensor(128.0))
    grads = [p.grad.detach().clone() for p in model.parameters()]
    seconds = {}
    for name, cls, clip_step in (
        ("torch", torch.optim.AdamW, torch_clip_step),
        ("hlat", ShardwiseAdamW, hlat_clip_step),
    ):
        _clear_sharding_prop_cache()
        clear_redistribute_planner_cache()
        optimizer = cls(model.parameters(), lr=1e-3, fused=True)
        for call in ("first", "second"):
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            dist.barrier()
            start = time.process_time()
            clip_step(model, optimizer).item()
            seconds[f"{name} {call}"] = time.process_time() - start
    if dist.get_rank() == 0:
        Path(os.environ["FIRST_STEP_OUT"]).write_text(json.dumps(seconds))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help="write the markdown record here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.layers, args.worker)
    conditions = Conditions()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, (world, _, _) in LAYOUTS.items():
            out = Path(scratch) / "seconds.json"
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
            env = {**os.environ, "FIRST_STEP_OUT": str(out), "OMP_NUM_THREADS": "1"}
            subprocess.run([*launcher, __file__, "--layers", str(args.layers), "--worker", name], env=env, check=True)
            s = json.loads(out.read_text())
            rows.append(
                f"| {name} | {world} | {s['torch first']:.3f} | {s['hlat first']:.3f} | "
                f"{s['torch first'] / s['hlat first']:.1f}x | {s['torch second']:.3f} | {s['hlat second']:.3f} |"
            )
            print(rows[-1], flush=True)
    lines = [
        "# Gradient clip and AdamW step on DTensor layouts: torch's DTensor ops against shard-wise",
        "",
        f"CPU seconds of rank 0 for `clip + AdamW step` of a {args.layers}-block LLaMA (d_model 64), "
        "first call (DTensor's plans made) and second (planned); fp32, fused AdamW, gloo.",
        "",
        "| layout | ranks | torch first | hlat first | ratio | torch second | hlat second |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "What it shows: torch's first `clip + step` on DTensors is spent planning list ops over the "
        "mesh, and it grows with the mesh's dimensions; hlat's shard-wise path plans nothing. What it "
        "does not show: a step of a real model, where the plan is paid once per run (cached after the "
        "first step) - it matters for start-up and for anything that builds many meshes (the tests).",
        "",
        *conditions.lines(),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
