"""Context parallelism on CPU: activation memory per rank and step time against sequence length.

For each sequence length and cp degree, `torchrun --nproc_per_node CP` (gloo) of this script's
worker: every rank builds the same model (the `tiny` preset, its max_seq_len raised to the
longest sequence), keeps its load-balanced chunks of one row (hlat.parallel.context_parallel)
and runs forward + loss + backward with ring attention over the cp ranks. Per rank: the bytes
the forward leaves alive for backward (hlat.parallel.saved_activations; the peak of activation
memory, reached when the forward ends), and the median step time after one warm-up step.

    python benchmarks/context_parallel_memory.py --seqs 512,1024,2048 --cps 1,2,4 --rounds 3 \
        --out benchmarks/context_parallel_memory.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from hlat.config.load import load_config
from hlat.data.batch import Batch, labels_for
from hlat.model import build_model
from hlat.model.ring_attention import RingContext
from hlat.parallel.context_parallel import shard_batch
from hlat.parallel.loss import token_loss_sum
from hlat.parallel.saved_activations import bytes_saved_for_backward

sys.path.insert(0, str(Path(__file__).parent))
from run_conditions import Conditions  # noqa: E402

MIB = 1024**2


def worker(seq: int, rounds: int, out: Path) -> None:
    """One rank of one (seq, cp) measurement: its bytes kept for backward and step times to `out`."""
    cp = int(os.environ.get("WORLD_SIZE", 1))
    rank = 0
    if cp > 1:
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    cfg = load_config("tiny", None, ["--model.max_seq_len", str(seq), "--data.seq_len", str(seq)]).model
    torch.manual_seed(0)
    model = build_model(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (1, seq + 1), generator=torch.Generator().manual_seed(0))
    batch = Batch(tokens[:, :-1], labels_for(tokens[:, :-1]))

    def loss() -> torch.Tensor:
        if cp == 1:
            return token_loss_sum(model(batch.tokens), batch.labels)
        mine = shard_batch(batch, rank, cp)
        ring = RingContext(dist.group.WORLD, rank, cp)
        return token_loss_sum(model(mine.tokens, positions=mine.positions, attn_mask=ring), mine.labels)

    def step() -> float:
        start = time.perf_counter()
        loss().backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    saved = bytes_saved_for_backward(loss)
    step()  # warm-up
    times = [step() for _ in range(rounds)]
    (out / f"rank{rank}.json").write_text(json.dumps({"saved": saved, "step_s": statistics.median(times)}))
    if cp > 1:
        dist.barrier()
        dist.destroy_process_group()


def measure(seq: int, cp: int, rounds: int) -> tuple[float, float]:
    """(the largest rank's MiB kept for backward, the slowest rank's median step s) at `seq`, `cp`."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cp}"]
        command += [__file__, "--worker", "--seqs", str(seq), "--rounds", str(rounds), "--out", tmp]
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True)
        ranks = [json.loads(p.read_text()) for p in Path(tmp).glob("rank*.json")]
    assert len(ranks) == cp, f"{len(ranks)} of {cp} ranks reported"
    return max(r["saved"] for r in ranks) / MIB, max(r["step_s"] for r in ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqs", default="512,1024,2048")
    parser.add_argument("--cps", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out")
    parser.add_argument("--worker", action="store_true", help="(internal) one rank of one measurement")
    args = parser.parse_args()
    if args.worker:
        return worker(int(args.seqs), args.rounds, Path(args.out))
    conditions = Conditions()
    cps = [int(c) for c in args.cps.split(",")]
    rows = []
    for seq in (int(s) for s in args.seqs.split(",")):
        results = {cp: measure(seq, cp, args.rounds) for cp in cps}
        base_mib, base_s = results[cps[0]]
        for cp, (mib, seconds) in results.items():
            rows.append(
                f"| {seq} | {cp} | {mib:.1f} | {mib / base_mib:.2f} | {1 / cp:.2f} | {seconds:.3f} | {seconds / base_s:.2f} |"
            )
        print(rows[-len(cps) :], flush=True)
    lines = [
        "# Context parallelism: activation memory per rank and step time (CPU)",
        "",
        *conditions.lines(),
        f"- the `tiny` preset (4 blocks, d_model 256), fp32, eager, batch 1; torchrun gloo, one process per cp rank, "
        f"OMP_NUM_THREADS=1; step = forward + loss + backward, median of {args.rounds} after one warm-up",
        "",
        f"| seq | cp | MiB kept for backward per rank | / cp {cps[0]} | 1 / cp | step s (median, slowest rank) | / cp {cps[0]} |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
