"""Whole `hlat train` runs as a user launches them: compiled by default against eager.

Each run is a fresh process (`python -m hlat train ...` with the given arguments), so start-up,
data, the compile probe and compilation all count. Runs alternate between the variants round by
round, so that drift of a shared machine hits both alike. Per run it reads the console (the compile
line) and metrics.jsonl (tokens/s and MFU of each step) and reports: wall time of the process,
steady tokens/s (median over the steps after the first, which carries compilation), tokens/s over
the whole process (all tokens / wall time), and the MFU the log printed. `--out FILE` writes the
markdown report with hardware, versions and date.

    python benchmarks/train_runs.py --args "--preset small --train.steps 6" --rounds 2 --out benchmarks/train_runs.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hlat.metrics.cpu_peak import read_cpu_facts

VARIANTS = {"default (compile auto)": [], "eager (--parallel.compile false)": ["--parallel.compile", "false"]}
QUIET = ["--eval.every", "0", "--train.sample_prompt", "", "--train.plot", "false", "--train.tensorboard", "false"]


@dataclass
class Run:
    wall_s: float
    compile_line: str
    steady_tokens_per_s: float
    tokens: int
    mfu: float | None


def one_run(args: list[str], run_dir: Path) -> Run:
    command = [sys.executable, "-m", "hlat", "train", *args, *QUIET, "--train.run_dir", str(run_dir), "--fresh"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steady = [r["tokens_per_s"] for r in records[1:]] or [records[-1]["tokens_per_s"]]
    compile_line = next((line for line in done.stdout.splitlines() if "compile:" in line), "")
    return Run(wall, compile_line.strip(), statistics.median(steady), records[-1]["tokens"], records[-1].get("mfu"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--args", default="--preset small --train.steps 6", help="the `hlat train` arguments")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", help="also write the markdown report to this file")
    opts = parser.parse_args()

    runs: dict[str, list[Run]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(opts.rounds):
            for name, extra in VARIANTS.items():
                run = one_run([*shlex.split(opts.args), *extra], Path(scratch) / f"{len(runs[name])}-{name[:7]}")
                runs[name].append(run)
                print(
                    f"round {round_ + 1}/{opts.rounds}: {name}: {run.wall_s:.0f} s, "
                    f"{run.steady_tokens_per_s:,.0f} tokens/s steady; {run.compile_line}",
                    flush=True,
                )

    baseline = statistics.median(r.steady_tokens_per_s for r in runs["eager (--parallel.compile false)"])
    lines = [
        "# Whole `hlat train` runs: compiled by default against eager",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- hardware: {read_cpu_facts().model}, {torch.get_num_threads()} threads, torch CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}",
        f"- versions: Python {platform.python_version()}, torch {torch.__version__}",
        f"- command: `hlat train {opts.args}` plus `{shlex.join(QUIET)}`, a fresh process per run; "
        f"{opts.rounds} rounds alternating the variants; medians over the rounds",
        "- steady tokens/s: median over each run's steps after the first (the first carries compilation); "
        "whole-process tokens/s: all tokens / the process's wall time (imports, data, probe and compilation included)",
        "",
        "| variant | wall s | steady tokens/s | vs eager | whole-process tokens/s | MFU (log) | compile line (first run) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, samples in runs.items():
        steady = statistics.median(r.steady_tokens_per_s for r in samples)
        wall = statistics.median(r.wall_s for r in samples)
        mfus = [r.mfu for r in samples if r.mfu is not None]
        mfu = f"{statistics.median(mfus):.1%}" if mfus else "-"
        lines.append(
            f"| {name} | {wall:.0f} | {steady:,.0f} | {steady / baseline:.2f}x | "
            f"{samples[0].tokens / wall:,.0f} | {mfu} | {samples[0].compile_line} |"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    if opts.out:
        Path(opts.out).write_text(report)


if __name__ == "__main__":
    main()
