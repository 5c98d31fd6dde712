"""Muon against AdamW on the CPU: validation loss against tokens, and the step time of Muon's
distributed orthogonalisation.

Loss: the precision study's model and data (benchmarks/precision_study.py: `tiny` reduced to 1.8M
parameters, the embedded corpus, a held-out split, warmup then cosine to 10% of the peak), trained
in fp32 with `--optim.name adamw` and `--optim.name muon` (the default match_rms_adamw rule, so the
same learning rate, schedule and weight decay; Newton-Schulz in fp32), seeds 0, 1, 2. A seed sets
the initialisation and the data order, so the two optimizers are compared seed by seed. Runs resume
like the precision study's (`result.json` per finished run under --work).

Step time: `torchrun --nproc_per_node 2 -m hlat train` for `--timing-steps` steps of the same model,
FSDP2 dp 2 and TP 2, each optimizer twice (AdamW, Muon, Muon, AdamW), from the median of the logged
tokens/s after the first window.

    nice python benchmarks/muon_study.py --out benchmarks/muon_study.md   # ~25 min on 2 cores
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

from precision_study import MODEL, train_one
from run_conditions import Conditions

OPTIMIZERS = {"adamw": [], "muon": ["--optim.name", "muon", "--optim.muon_ns_dtype", "float32"]}
LAYOUTS = {"FSDP2 dp 2": ["--parallel.dp_sharding", "fsdp"], "TP 2": ["--parallel.tp", "2"]}
COLORS = {"adamw": "black", "muon": "tab:orange"}


def loss_runs(args: argparse.Namespace) -> list[dict]:
    runs = []
    for seed in map(int, args.seeds.split(",")):
        for name, flags in OPTIMIZERS.items():
            run_dir = args.work / f"{name}-seed{seed}"
            done = run_dir / "result.json"
            if done.exists() and json.loads(done.read_text())["steps"] == args.steps:
                run = json.loads(done.read_text())
            else:
                settings = argparse.Namespace(**{**vars(args), "overrides": flags})
                run = train_one("tiny", "fp32", seed, run_dir, settings)
            run["optimizer"] = name
            runs.append(run)
            print(
                f"{name:5s} seed {seed}: final val {run['final_val_loss']:.4f}, tail val {run['tail_val_loss']:.4f}",
                flush=True,
            )
    return runs


def step_seconds(flags: list[str], steps: int, work: Path) -> float:
    """Median seconds per step of a 2-process run after its first logged window."""
    run_dir = Path(tempfile.mkdtemp(dir=work))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "hlat", "train",
        "--preset", "tiny", *MODEL, *flags, "--train.steps", str(steps), "--train.log_every", "5",
        "--eval.every", "0", "--train.tensorboard", "false", "--train.plot", "false", "--checkpoint.every", str(steps),
        "--train.run_dir", str(run_dir),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    tokens = records[0]["tokens"] / records[0]["step"]
    return statistics.median(tokens / r["tokens_per_s"] for r in records[1:] if "tokens_per_s" in r)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    tokens_per_step = 8 * 128
    for name in OPTIMIZERS:
        curves = [r for r in runs if r["optimizer"] == name]
        xs = [s * tokens_per_step / 1e6 for s, _ in curves[0]["val"]]
        columns = list(zip(*([v for _, v in r["val"]] for r in curves)))
        ax.plot(
            xs,
            [statistics.fmean(c) for c in columns],
            color=COLORS[name],
            label=f"{name} (mean of {len(curves)} seeds)",
        )
        ax.fill_between(xs, [min(c) for c in columns], [max(c) for c in columns], color=COLORS[name], alpha=0.2)
    later = [v for r in runs for s, v in r["val"] if s >= runs[0]["steps"] / 10]
    ax.set_ylim(min(later) - 0.05, max(later) + 0.1)
    ax.set(
        xlabel="tokens (millions)",
        ylabel="validation loss (nats/token)",
        title="AdamW and Muon, same recipe (band: min-max)",
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--checkpoint-every", type=int, default=500)
    parser.add_argument("--timing-steps", type=int, default=40)
    parser.add_argument("--work", type=Path, default=Path("runs/muon-study"))
    parser.add_argument("--out", type=Path, help="write the record here (markdown; the PNG beside it)")
    args = parser.parse_args()
    conditions = Conditions()
    runs = loss_runs(args)
    lines = [
        "# Muon against AdamW on the CPU",
        "",
        f"`tiny` reduced to {runs[0]['params'] / 1e6:.1f}M parameters ({' '.join(MODEL)}), 8 x 128 tokens a step, "
        f"{args.steps} steps, warmup {args.warmup} then cosine to 10% of peak LR {runs[0]['lr']:g}, fp32, "
        "Muon with its defaults (match_rms_adamw) and fp32 Newton-Schulz. Validation: 8 held-out batches "
        f"every {args.eval_every} steps; the tail is the evaluations in the last fifth. Mean [min, max] over seeds.",
        "",
        "| optimizer | final validation loss | tail validation loss | Muon minus AdamW, same seed (tail) |",
        "|---|---|---|---|",
    ]
    adamw = {r["seed"]: r for r in runs if r["optimizer"] == "adamw"}
    for name in OPTIMIZERS:
        mine = [r for r in runs if r["optimizer"] == name]
        cell = lambda key: (
            f"{statistics.fmean(r[key] for r in mine):.4f} [{min(r[key] for r in mine):.4f}, {max(r[key] for r in mine):.4f}]"
        )  # noqa: E731
        diffs = [r["tail_val_loss"] - adamw[r["seed"]]["tail_val_loss"] for r in mine]
        paired = "" if name == "adamw" else f"{statistics.fmean(diffs):+.4f} [{min(diffs):+.4f}, {max(diffs):+.4f}]"
        lines.append(f"| {name} | {cell('final_val_loss')} | {cell('tail_val_loss')} | {paired} |")
    lines += [
        "",
        f"Step time, 2 processes (gloo, one thread each), {args.timing_steps} steps: the median of the logged "
        "5-step windows after the first, the mean of two runs each in the order AdamW, Muon, Muon, AdamW:",
        "",
    ]
    lines += ["| layout | AdamW s/step | Muon s/step | Muon / AdamW |", "|---|---|---|---|"]
    for layout, flags in LAYOUTS.items():
        times = dict.fromkeys(OPTIMIZERS, 0.0)
        for name in ("adamw", "muon", "muon", "adamw"):  # ABBA: a drift in the machine's speed cancels
            times[name] += step_seconds([*flags, *OPTIMIZERS[name]], args.timing_steps, args.work) / 2
        lines.append(
            f"| {layout} | {times['adamw']:.4f} | {times['muon']:.4f} | {times['muon'] / times['adamw']:.2f} |"
        )
        print(lines[-1], flush=True)
    lines += ["", "Conditions:", "", *conditions.lines()]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
        plot(runs, args.out.with_suffix(".png"))
        print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
