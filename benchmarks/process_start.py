"""What one `hlat train` process costs from start to exit, in CPU-seconds: a tiny run (the test
suite's 2-layer model, 3 fp32 steps on the embedded corpus, eager, one thread) of this tree
against the same run of a baseline revision's `src/`, interleaved so that a change in the
machine's load falls on both:

    python benchmarks/process_start.py [--baseline REV] [--runs N]

Each run is a fresh interpreter, as every process of a multi-process launch is; a tiny run spends
most of its time importing (torch, its distributed packages, hlat), so this is the start-up cost
every rank of a real launch pays too. The baseline is exported with `git archive` into a
temporary directory and put first on PYTHONPATH. Prints the median and range of each, and the
conditions (benchmarks/run_conditions.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from run_conditions import Conditions

REPO = Path(__file__).resolve().parents[1]
BASELINE = "1de2d7d"  # before ZeRO-1's optimizer module was imported on first use only
RUN = [  # the test suite's tiny model (tests/runs.py), so that start-up, not training, dominates
    "train", "--fresh", "--train.steps", "3", "--precision.mode", "fp32", "--parallel.compile", "false",
    "--model.vocab_size", "512", "--model.d_model", "64", "--model.n_layers", "2", "--model.n_heads", "4",
    "--model.n_kv_heads", "2", "--model.ffn_dim", "128", "--model.max_seq_len", "64", "--data.seq_len", "32",
    "--train.global_batch", "8", "--train.micro_batch", "2", "--train.tensorboard", "false",
    "--train.plot", "false", "--eval.every", "0", "--train.sample_prompt", "",
]  # fmt: skip


def export(rev: str, into: Path) -> Path:
    """`src/` of `rev`, unpacked under `into`."""
    archive = into / "src.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(REPO), "archive", rev, "src"], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def check_imports_from(src: Path) -> None:
    """Fail unless `python -m hlat` with `src` first on the path runs that tree (not an installed one)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    found = subprocess.run(
        [sys.executable, "-c", "import hlat; print(hlat.__file__)"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    if not Path(found).is_relative_to(src):
        raise SystemExit(f"hlat imports from {found}, not {src}: an installed copy comes first on the path")


def one_run(src: Path, run_dir: Path) -> tuple[float, float]:
    """(CPU-seconds, wall seconds) of one `python -m hlat train` with `src` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "hlat", *RUN, "--train.run_dir", str(run_dir)],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help="the revision to compare with (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=8, help="runs of each, interleaved (default: %(default)s)")
    args = parser.parse_args()
    conditions = Conditions()
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"this tree": REPO / "src", f"baseline {args.baseline}": export(args.baseline, Path(scratch))}
        for src in trees.values():
            check_imports_from(src)
        seen: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        for i in range(args.runs):
            for j, (name, src) in enumerate(trees.items()):
                seen[name].append(one_run(src, Path(scratch) / f"run{i}-{j}"))
                print(f"{name}: {seen[name][-1][0]:.2f} CPU-s", file=sys.stderr, flush=True)
    print(f"`hlat train` tiny run, {args.runs} runs each, interleaved: CPU-seconds and wall seconds per process\n")
    print("| tree | CPU-s, median (min-max) | wall s, median |")
    print("|---|---|---|")
    for name, runs in seen.items():
        cpu = [c for c, _ in runs]
        print(f"| {name} | {statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f}) | "
              f"{statistics.median(w for _, w in runs):.2f} |")  # fmt: skip
    print()
    print("\n".join(conditions.lines()))


if __name__ == "__main__":
    main()
