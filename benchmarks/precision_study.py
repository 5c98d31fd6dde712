"""The precision study: the same model, seed and data trained in all four precision modes.

Runs the trainer (hlat.config.load_config + hlat.train.trainer.Trainer, as `hlat train` does) on
the embedded corpus (Python's standard library) with a held-out validation split, then writes
docs/precision_study.png (train and validation loss per mode), docs/precision_study.json (every
number) and the "Study results" section of docs/precision.md.

Two experiments:
- main: the preset as configured (default `tiny`, its 200 steps and LR 2e-3), all four modes;
- low-LR: the same with a 10x lower peak LR (updates small against the weights, as late in a long
  run), fp32, bf16-sr and bf16: where round-to-nearest is expected to lose updates.

`mixed` computes in bf16, which this kind of CPU (no AVX512-BF16/AMX) emulates at ~70 tokens/s on
`tiny` (100+ minutes for 200 steps). On such a CPU the study runs `mixed` as it is (bf16 copy of
the weights, bf16 residual stream, fp32 ops fp32) with only its linear layers and attention
emulated by hlat.precision.emulated_mixed (bf16-rounded inputs and weights, fp32 accumulation,
bf16 output: what bf16 matmul units compute) at fp32 speed, and says so in the table. Its
tokens/s is then not the speed of real bf16 compute here.

    python benchmarks/precision_study.py                 # tiny preset as is: ~1 h on 2 shared cores
    python benchmarks/precision_study.py --steps 120 --low-lr-steps 80 --eval-every 20 -- \
        --model.d_model 128 --model.n_heads 4 --model.n_kv_heads 2 --model.ffn_dim 344 --data.seq_len 128 \
        --schedule.warmup_steps 10 --schedule.decay_steps 120        # what docs/precision.md reports
    python benchmarks/precision_study.py --steps 20 --low-lr-steps 0 --no-doc   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path

import torch

import hlat
import hlat.parallel.parallelize as parallelize
from hlat import precision
from hlat.config.load import load_config
from hlat.model import count_params
from hlat.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MODES = ("fp32", "mixed", "bf16-sr", "bf16")
COLORS = {"fp32": "black", "mixed": "tab:blue", "bf16-sr": "tab:green", "bf16": "tab:red"}
START, END = "<!-- precision-study:start -->", "<!-- precision-study:end -->"


def cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def install_emulation(device: torch.device) -> bool:
    """Route `mixed` through precision.emulated_mixed on a CPU without bf16 units; True if it did."""
    if device.type != "cpu" or cpu_has_bf16():
        return False
    native = parallelize.autocast

    def study_autocast(mode: str, dev: torch.device) -> contextlib.AbstractContextManager:
        return precision.emulated_mixed(dev) if mode == "mixed" and dev.type == "cpu" else native(mode, dev)

    parallelize.autocast = study_autocast
    return True


def train_one(preset: str, mode: str, run_dir: Path, steps: int, extra: list[str]) -> dict:
    overrides = [
        "--precision.mode", mode, "--train.run_dir", str(run_dir), "--train.steps", str(steps),
        "--train.tensorboard", "false", "--data.val_source", "holdout", *extra,
    ]  # fmt: skip
    cfg = load_config(preset, None, overrides)
    trainer = Trainer(cfg, resume="fresh", out=lambda line: None)
    start = time.perf_counter()
    summary = trainer.fit()
    wall = time.perf_counter() - start
    trainer.checkpoints.wait()
    opt = trainer.optimizers.optimizers[0]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    val = [r for r in records if "val_loss" in r]
    speeds = [r["tokens_per_s"] for r in train[1:]] or [r["tokens_per_s"] for r in train]  # window 1 holds the compile
    return {
        "mode": mode,
        "steps": summary.step,
        "tokens": summary.tokens,
        "wall_s": wall,
        "losses": summary.losses,
        "val": [(r["step"], r["val_loss"]) for r in val],
        "final_train_loss": sum(summary.losses[-10:]) / len(summary.losses[-10:]),
        "final_val_loss": val[-1]["val_loss"] if val else None,
        "tokens_per_s": sorted(speeds)[len(speeds) // 2],
        "state_bytes_per_param": precision.state_bytes_per_param(trainer.model.parameters(), opt),
        "lr": cfg.optim.lr,
        "params": count_params(cfg.model),
    }


def smooth(xs: list[float], k: int = 10) -> list[float]:
    return [sum(xs[max(0, i - k + 1) : i + 1]) / len(xs[max(0, i - k + 1) : i + 1]) for i in range(len(xs))]


def plot(experiments: dict[str, list[dict]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(experiments), figsize=(6.5 * len(experiments), 4.5), squeeze=False)
    for ax, (name, runs) in zip(axes[0], experiments.items()):
        for run in runs:
            color = COLORS[run["mode"]]
            steps = range(1, len(run["losses"]) + 1)
            ax.plot(steps, smooth(run["losses"]), color=color, lw=1.2, label=f"{run['mode']} train (10-step mean)")
            if run["val"]:
                ax.plot(*zip(*run["val"]), "o--", color=color, ms=4, lw=0.8, label=f"{run['mode']} validation")
        ax.set_title(f"{name}: peak LR {runs[0]['lr']:g}")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats/token)")
        losses = [x for run in runs for x in run["losses"][len(run["losses"]) // 5 :]]
        ax.set_ylim(min(losses) - 0.1, max(losses) + 0.1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(runs: list[dict], emulated: bool) -> list[str]:
    ref = next((r for r in runs if r["mode"] == "fp32"), None)
    lines = [
        "| mode | final train loss (last 10 steps) | vs fp32 | final validation loss | vs fp32 | tokens/s (median window) | bytes/param of state |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        rel = lambda key: "" if ref is None or r[key] is None else f"{100 * (r[key] / ref[key] - 1):+.2f}%"
        val = "-" if r["final_val_loss"] is None else f"{r['final_val_loss']:.4f}"
        mode = r["mode"] + (" (bf16 emulated, see above)" if r["mode"] == "mixed" and emulated else "")
        lines.append(
            f"| {mode} | {r['final_train_loss']:.4f} | {rel('final_train_loss')} | {val} | {rel('final_val_loss')} "
            f"| {r['tokens_per_s']:,.0f} | {r['state_bytes_per_param']:.0f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--low-lr-factor", type=float, default=0.1)
    parser.add_argument("--low-lr-steps", type=int, default=100, help="0 skips the low-LR experiment")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "overrides", nargs="*", help="config overrides for every run, e.g. --model.d_model 128 (after --)"
    )
    parser.add_argument("--no-doc", action="store_true", help="print the results only; leave docs/ alone")
    parser.add_argument("--work", type=Path, default=None, help="run directories (default: a temporary one)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    emulated = install_emulation(device)
    modes = args.modes.split(",")
    work = args.work or Path(tempfile.mkdtemp(prefix="hlat-precision-study-"))
    common = [
        "--eval.every",
        str(args.eval_every),
        "--train.seed",
        str(args.seed),
        "--train.log_every",
        "10",
        *args.overrides,
    ]
    started = time.time()
    experiments: dict[str, list[dict]] = {"main": []}
    for mode in modes:
        run = train_one(args.preset, mode, work / f"main-{mode}", args.steps, common)
        experiments["main"].append(run)
        print(
            f"main {mode:8s} train {run['final_train_loss']:.4f} val {run['final_val_loss']} "
            f"{run['tokens_per_s']:,.0f} tok/s {run['state_bytes_per_param']:.0f} B/param ({run['wall_s']:.0f} s)",
            flush=True,
        )
    if args.low_lr_steps:
        lr = experiments["main"][0]["lr"] * args.low_lr_factor
        experiments["low-LR"] = []
        for mode in [m for m in modes if m != "mixed"]:
            run = train_one(
                args.preset, mode, work / f"low-{mode}", args.low_lr_steps, common + ["--optim.lr", f"{lr:g}"]
            )
            experiments["low-LR"].append(run)
            print(
                f"low-LR {mode:8s} train {run['final_train_loss']:.4f} val {run['final_val_loss']} ({run['wall_s']:.0f} s)",
                flush=True,
            )
    env = {
        "date": datetime.date.today().isoformat(),
        "hlat": hlat.__version__ if hasattr(hlat, "__version__") else "dev",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "?",
        )
        if Path("/proc/cpuinfo").exists()
        else "?",
        "cores": os.cpu_count(),
        "device": device.type,
        "mixed_emulated": emulated,
        "wall_s": time.time() - started,
        "loadavg_end": os.getloadavg()[0],
        "preset": args.preset,
        "overrides": args.overrides,
        "steps": args.steps,
        "low_lr_steps": args.low_lr_steps,
    }
    print(json.dumps(env))
    for name, runs in experiments.items():
        print(f"\n{name}:\n" + "\n".join(table(runs, emulated)))
    if args.no_doc:
        return
    DOCS.mkdir(exist_ok=True)
    (DOCS / "precision_study.json").write_text(json.dumps({"env": env, "experiments": experiments}, indent=1))
    main_run = experiments["main"][0]
    plot(
        experiments,
        DOCS / "precision_study.png",
        f"{args.preset} preset ({main_run['params'] / 1e6:.1f}M params), seed {args.seed}, same data in every mode",
    )
    print(f"wrote {DOCS / 'precision_study.png'} and {DOCS / 'precision_study.json'}")


if __name__ == "__main__":
    main()
