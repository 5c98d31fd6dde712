"""Core attention with document masking on CPU: time and peak memory of forward + backward against
sequence length, for causal attention without documents, the dense document mask (hlat's CPU path)
and a per-document block-diagonal loop (SDPA causal on each document's slice).

Shapes of the `tiny` preset's attention (8 query heads, 4 K/V heads, head_dim 32), batch 2, native
GQA (hlat.model.attention.sdpa). Documents have lengths drawn uniformly from 32..480 (mean 256).
The three paths alternate inside each repetition (the CPUs are shared: medians). Peak memory = the
rise of the resident set (VmHWM, reset before each pass, freed memory returned by malloc_trim)
over one forward + backward. Writes benchmarks/attention_masking.md.
Usage: python benchmarks/attention_masking.py [--lengths 256 512 1024 2048] [--reps 7]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from hlat.metrics.cpu_peak import read_cpu_facts
from hlat.metrics.memory import GIB, MemoryMeter
from hlat.model.attention import dense_document_mask, sdpa

HEADS, KV_HEADS, HEAD_DIM, BATCH = 8, 4, 32, 2
_LIBC = ctypes.CDLL("libc.so.6")


def document_ids(length: int, gen: torch.Generator) -> torch.Tensor:
    """[BATCH, length] document numbers of rows packed with documents of 32..480 tokens."""
    rows = []
    for _ in range(BATCH):
        sizes: list[int] = []
        while sum(sizes) < length:
            sizes.append(int(torch.randint(32, 481, (), generator=gen)))
        rows.append(torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))[:length])
    return torch.stack(rows)


def block_diagonal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc_ids: torch.Tensor) -> torch.Tensor:
    """Causal SDPA on each document's slice of each row: no mask, work sum of squared lengths."""
    rows = []
    for b in range(q.size(0)):
        counts = torch.unique_consecutive(doc_ids[b], return_counts=True)[1].tolist()
        pieces = zip(q[b : b + 1].split(counts, 2), k[b : b + 1].split(counts, 2), v[b : b + 1].split(counts, 2))
        rows.append(torch.cat([sdpa(qd, kd, vd, None) for qd, kd, vd in pieces], dim=2))
    return torch.cat(rows)


def measure(run: Callable[[], torch.Tensor], meter: MemoryMeter) -> tuple[float, float]:
    """Seconds and peak resident-set rise (GiB) of one forward + backward."""
    _LIBC.malloc_trim(0)
    base = meter.read()["mem_rss_gib"]
    start = time.perf_counter()
    run().sum().backward()
    seconds = time.perf_counter() - start
    return seconds, meter.read()["mem_peak_gib"] - base


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    meter = MemoryMeter(torch.device("cpu"))
    rows = []
    for T in args.lengths:
        q = torch.randn(BATCH, HEADS, T, HEAD_DIM, generator=gen, requires_grad=True)
        k, v = (torch.randn(BATCH, KV_HEADS, T, HEAD_DIM, generator=gen, requires_grad=True) for _ in range(2))
        doc_ids = document_ids(T, gen)
        paths: dict[str, Callable[[], torch.Tensor]] = {
            "causal, no documents": lambda: sdpa(q, k, v, None),
            "dense document mask": lambda: sdpa(q, k, v, dense_document_mask(doc_ids)),
            "block-diagonal loop": lambda: block_diagonal(q, k, v, doc_ids),
        }
        for run in paths.values():  # warm-up
            measure(run, meter)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
        for _ in range(args.reps):
            for name, run in paths.items():
                samples[name].append(measure(run, meter))
        docs = float((doc_ids.max(dim=1).values + 1).float().mean())
        for name, values in samples.items():
            ms = statistics.median(s for s, _ in values) * 1e3
            mib = statistics.median(m for _, m in values) * GIB / 2**20
            rows.append(f"| {T} | {docs:.1f} | {name} | {ms:.2f} | {mib:.1f} |")
        print("\n".join(rows[-len(paths) :]), flush=True)
    write_report(Path(args.out), args, rows)


def write_report(out: Path, args: argparse.Namespace, rows: list[str]) -> None:
    cpu = read_cpu_facts().model
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    header = [
        "# Document masking on CPU: forward + backward of core attention",
        "",
        f"`python benchmarks/attention_masking.py --lengths {' '.join(map(str, args.lengths))} --reps {args.reps}`, "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC.",
        f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads; load average at the end {load} "
        "(a machine shared with other work: times are medians of alternating passes and noisy).",
        f"torch {torch.__version__}, Python {platform.python_version()}. Batch {BATCH}, {HEADS} query heads, "
        f"{KV_HEADS} K/V heads, head_dim {HEAD_DIM}, fp32, native GQA; documents of 32..480 tokens.",
        "Peak memory: rise of the resident set over one pass (median), so it includes the mask, the "
        "float mask SDPA derives from it, the saved tensors and the gradients.",
        "",
        "| T | documents per row | path | ms (median) | peak MiB (median) |",
        "|---|---|---|---|---|",
    ]
    out.write_text("\n".join(header + rows) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
