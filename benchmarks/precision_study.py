"""The precision study: one model trained into the decayed learning-rate tail in all four modes, 3 seeds.

Runs the trainer (hlat.config.load_config + hlat.train.trainer.Trainer, as `hlat train` does) on
the embedded corpus (Python's standard library) with a held-out validation split: each mode x seed
trains the same model for `--steps` steps, warmup then cosine to 10% of the peak learning rate at
the last step, so the last fifth of every run is the low-LR tail where round-to-nearest bf16 is
expected to lose updates (an Adam update of ~lr meets half a bf16 ulp of the weights). A seed sets
the initialisation, the data order and bf16-sr's rounding noise; within a seed every mode sees the
same batches, so each mode is compared with fp32 seed by seed (paired differences).

The study resumes: each finished run leaves `result.json` in its run directory under `--work` and
is skipped next time; a run stopped part way resumes from its last checkpoint (exact resume). Once
every run is recorded it writes docs/precision_study.png (validation loss per mode, and each
mode's paired difference from fp32 against the learning rate), docs/precision_study.json (every
number) and the tables between the study markers of docs/precision.md.

`mixed` computes in bf16, which a CPU without AVX512-BF16/AMX emulates at ~1 GFLOP/s. On such a
CPU the study runs `mixed` as it is (bf16 copy of the weights, bf16 residual stream, fp32 ops fp32)
with only its linear layers and attention emulated by hlat.precision.emulated_mixed (bf16-rounded
inputs and weights, fp32 accumulation, bf16 output: what bf16 matmul units compute) at fp32 speed,
and says so in the table. On a CPU with bf16 units `mixed` runs natively.

    nice python benchmarks/precision_study.py     # the recorded study: 12 runs x 2,000 steps, ~1 h on 2 cores
    python benchmarks/precision_study.py --steps 40 --seeds 0 --work /tmp/smoke --no-doc   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

import hlat.parallel.parallelize as parallelize
from hlat import precision
from hlat.config.load import load_config
from hlat.metrics.cpu_peak import has_native_bf16, read_cpu_facts
from hlat.model import count_params
from hlat.optim.schedule import lr_multiplier
from hlat.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MODES = ("fp32", "mixed", "bf16-sr", "bf16")
COLORS = {"fp32": "black", "mixed": "tab:blue", "bf16-sr": "tab:green", "bf16": "tab:red"}
START, END = "<!-- precision-study:start -->", "<!-- precision-study:end -->"
# The recorded study's model: `tiny` reduced to 1.8M parameters so 12 runs of 2,000 steps fit 90
# minutes of 2 cores; the schedule decays to 10% of the peak at the last step.
MODEL = [
    "--model.d_model", "128", "--model.n_heads", "4", "--model.n_kv_heads", "2", "--model.ffn_dim", "344",
    "--data.seq_len", "128",
]  # fmt: skip
TAIL = 0.2  # the tail: evaluations in the last fifth of the steps, where the LR is under ~16% of the peak


def cpu_has_bf16() -> bool:
    return has_native_bf16(read_cpu_facts().flags)


def install_emulation(device: torch.device) -> bool:
    """Route `mixed` through precision.emulated_mixed on a CPU without bf16 units; True if it did."""
    if device.type != "cpu" or cpu_has_bf16():
        return False
    native = parallelize.autocast

    def study_autocast(mode: str, dev: torch.device) -> contextlib.AbstractContextManager:
        return precision.emulated_mixed(dev) if mode == "mixed" and dev.type == "cpu" else native(mode, dev)

    parallelize.autocast = study_autocast
    return True


def run_overrides(mode: str, seed: int, steps: int, args: argparse.Namespace, run_dir: Path) -> list[str]:
    return [
        *MODEL,
        "--precision.mode", mode, "--train.seed", str(seed), "--train.run_dir", str(run_dir),
        "--train.steps", str(steps), "--train.log_every", "50", "--train.tensorboard", "false",
        "--schedule.name", "cosine", "--schedule.min_lr_ratio", "0.1",
        "--schedule.warmup_steps", str(args.warmup), "--schedule.decay_steps", str(steps),
        "--eval.every", str(args.eval_every), "--eval.batches", str(args.eval_batches),
        "--data.val_source", "holdout", "--checkpoint.every", str(args.checkpoint_every),
        "--checkpoint.keep_last", "1", *args.overrides,
    ]  # fmt: skip


def train_one(preset: str, mode: str, seed: int, run_dir: Path, args: argparse.Namespace) -> dict:
    """Train (or finish) one run; its record, also left in run_dir/result.json."""
    cfg = load_config(preset, None, run_overrides(mode, seed, args.steps, args, run_dir))
    trainer = Trainer(cfg, resume="auto", out=lambda line: None)
    start = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - start
    trainer.checkpoints.wait()
    opt = trainer.optimizers.optimizers[0]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    losses = [x for r in train for x in r["step_losses"]]
    if len(losses) != args.steps:
        raise RuntimeError(f"{run_dir}/metrics.jsonl holds {len(losses)} step losses, expected {args.steps}")
    speeds = sorted(r["tokens_per_s"] for r in train[1:])  # the first window holds the compile
    tail = [v for s, v in val if s > (1 - TAIL) * args.steps]
    result = {
        "mode": mode,
        "seed": seed,
        "steps": args.steps,
        "losses": losses,
        "val": val,
        "final_train_loss": statistics.fmean(losses[-50:]),
        "final_val_loss": val[-1][1],
        "tail_val_loss": statistics.fmean(tail),
        "tokens_per_s": speeds[len(speeds) // 2],
        "wall_s": wall,  # this invocation's: a resumed run counts only its remainder
        "state_bytes_per_param": precision.state_bytes_per_param(trainer.model.parameters(), opt),
        "lr": cfg.optim.lr,
        "lr_multipliers": [lr_multiplier(cfg.schedule, s) for s in range(args.steps)],
        "params": count_params(cfg.model),
    }
    (run_dir / "result.json").write_text(json.dumps(result))
    return result


def paired(runs: list[dict], mode: str, key: str) -> list[float]:
    """mode's value minus fp32's, seed by seed (same data and initialisation)."""
    ref = {r["seed"]: r[key] for r in runs if r["mode"] == "fp32"}
    return [r[key] - ref[r["seed"]] for r in runs if r["mode"] == mode and r["seed"] in ref]


def spread(xs: list[float], sign: str = "+") -> str:
    """The mean and [min, max]; sign "+" marks differences, "" plain values."""
    if len(xs) == 1:
        return f"{xs[0]:{sign}.4f}"
    return f"{statistics.fmean(xs):{sign}.4f} [{min(xs):{sign}.4f}, {max(xs):{sign}.4f}]"


def tables(runs: list[dict], modes: list[str], emulated: bool) -> list[str]:
    seeds = sorted({r["seed"] for r in runs})
    lines = [
        f"Per mode, the mean over seeds {', '.join(map(str, seeds))} and [min, max]; losses in nats per token.",
        "",
        "| mode | final train loss (last 50 steps) | final validation loss | tail validation loss "
        f"(evaluations after step {int((1 - TAIL) * runs[0]['steps'])}) | bytes/param of state |",
        "|---|---|---|---|---|",
    ]
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode]
        cell = lambda key: spread([r[key] for r in mine], sign="")  # noqa: E731
        name = mode + (" (bf16 matmuls emulated)" if mode == "mixed" and emulated else "")
        lines.append(
            f"| {name} | {cell('final_train_loss')} | {cell('final_val_loss')} | {cell('tail_val_loss')} "
            f"| {mine[0]['state_bytes_per_param']:.0f} |"
        )
    lines += [
        "",
        "Paired differences from fp32 (same seed: same initialisation and batches), mean [min, max] over seeds:",
        "",
        "| mode | final train loss | final validation loss | tail validation loss | seeds worse than fp32 in the tail |",
        "|---|---|---|---|---|",
    ]
    for mode in [m for m in modes if m != "fp32"]:
        tail = paired(runs, mode, "tail_val_loss")
        lines.append(
            f"| {mode} | {spread(paired(runs, mode, 'final_train_loss'))} "
            f"| {spread(paired(runs, mode, 'final_val_loss'))} | {spread(tail)} "
            f"| {sum(d > 0 for d in tail)} of {len(tail)} |"
        )
    return lines


def plot(runs: list[dict], modes: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    steps = runs[0]["steps"]
    for mode in modes:
        mine = sorted((r for r in runs if r["mode"] == mode), key=lambda r: r["seed"])
        xs = [s for s, _ in mine[0]["val"]]
        curves = [[v for _, v in r["val"]] for r in mine]
        mean = [statistics.fmean(col) for col in zip(*curves)]
        left.plot(xs, mean, color=COLORS[mode], lw=1.4, label=f"{mode} (mean of {len(mine)} seeds)")
        left.fill_between(
            xs, [min(c) for c in zip(*curves)], [max(c) for c in zip(*curves)], color=COLORS[mode], alpha=0.15
        )
        if mode == "fp32":
            continue
        ref = {r["seed"]: [v for _, v in r["val"]] for r in runs if r["mode"] == "fp32"}
        diffs = [[v - f for v, f in zip(c, ref[r["seed"]])] for c, r in zip(curves, mine)]
        right.plot(xs, [statistics.fmean(col) for col in zip(*diffs)], color=COLORS[mode], lw=1.4, label=mode)
        right.fill_between(
            xs, [min(c) for c in zip(*diffs)], [max(c) for c in zip(*diffs)], color=COLORS[mode], alpha=0.15
        )
    later = [v for r in runs for s, v in r["val"] if s >= steps / 10]  # the first evaluations dwarf the tail
    left.set_ylim(top=max(later) + 0.1)
    left.set(title="validation loss (band: min-max over seeds)", xlabel="step", ylabel="nats/token")
    right.axhline(0, color="black", lw=0.8)
    right.axvspan((1 - TAIL) * steps, steps, color="grey", alpha=0.12, label="the tail")
    right.set(title="validation loss minus fp32's, same seed", xlabel="step", ylabel="nats/token")
    lr = right.twinx()
    lr.plot(range(1, steps + 1), [runs[0]["lr"] * m for m in runs[0]["lr_multipliers"]], color="grey", ls=":", lw=1)
    lr.set_ylabel("learning rate (dotted)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def environment(args: argparse.Namespace, device: torch.device, emulated: bool, runs: list[dict]) -> dict:
    return {
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_model": read_cpu_facts().model,
        "cpu_bf16_units": cpu_has_bf16(),
        "cores": os.cpu_count(),
        "device": device.type,
        "mixed_emulated": emulated,
        "train_s_all_runs": sum(r["wall_s"] for r in runs),
        "preset": args.preset,
        "overrides": MODEL + args.overrides,
        "steps": args.steps,
        "warmup": args.warmup,
    }


def write_doc(runs: list[dict], modes: list[str], env: dict, emulated: bool) -> None:
    # every number but the schedule (the config's), losses to 5 decimals: what the tables and PNG read
    compact = [
        {**{k: v for k, v in r.items() if k != "lr_multipliers"}, "losses": [round(x, 5) for x in r["losses"]]}
        for r in runs
    ]
    (DOCS / "precision_study.json").write_text(json.dumps({"env": env, "runs": compact}))
    params = runs[0]["params"] / 1e6
    seeds = sorted({r["seed"] for r in runs})
    plot(runs, modes, DOCS / "precision_study.png",
         f"{env['preset']} preset reduced to {params:.1f}M params, {env['steps']} steps, cosine to 10% of peak LR "
         f"{runs[0]['lr']:g}, seeds {', '.join(map(str, seeds))}")  # fmt: skip
    block = [
        START,
        f"Recorded {env['date']} on {env['cores']} cores of {env['cpu_model']} "
        f"(bf16 units: {'yes' if env['cpu_bf16_units'] else 'no'}), torch {env['torch']}, Python {env['python']}; "
        f"{len(runs)} runs, {env['train_s_all_runs'] / 60:.0f} minutes of training.",
        "",
        *tables(runs, modes, emulated),
        END,
    ]
    doc = DOCS / "precision.md"
    text = doc.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{doc}: the study markers {START} ... {END} are missing; add them where the tables go")
    head, rest = text.split(START, 1)
    doc.write_text(head + "\n".join(block) + rest.split(END, 1)[1])
    print(f"wrote {DOCS / 'precision_study.png'}, {DOCS / 'precision_study.json'} and the tables in {doc}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--checkpoint-every", type=int, default=500)
    parser.add_argument(
        "--work", type=Path, default=Path("runs/precision-study"), help="run directories; reruns resume here"
    )
    parser.add_argument("--no-doc", action="store_true", help="print the results only; leave docs/ alone")
    parser.add_argument("overrides", nargs="*", help="config overrides for every run (after --)")
    args = parser.parse_args()
    if args.steps % args.eval_every:
        parser.error("--steps must be a multiple of --eval-every, so every run ends with an evaluation")
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    emulated = install_emulation(device)
    modes = args.modes.split(",")
    plan = [(mode, int(seed)) for seed in args.seeds.split(",") for mode in modes]
    runs = []
    for i, (mode, seed) in enumerate(plan, 1):
        run_dir = args.work / f"{mode}-seed{seed}"
        done = run_dir / "result.json"
        if done.exists() and json.loads(done.read_text())["steps"] == args.steps:
            run = json.loads(done.read_text())
            state = "recorded"
        else:
            run = train_one(args.preset, mode, seed, run_dir, args)
            state = f"{run['wall_s']:.0f} s"
        runs.append(run)
        print(
            f"[{i}/{len(plan)}] {mode:8s} seed {seed}: final val {run['final_val_loss']:.4f}, "
            f"tail val {run['tail_val_loss']:.4f}, {run['tokens_per_s']:,.0f} tok/s ({state})",
            flush=True,
        )
    env = environment(args, device, emulated, runs)
    print(json.dumps(env))
    print("\n".join(tables(runs, modes, emulated)))
    if not args.no_doc:
        write_doc(runs, modes, env, emulated)


if __name__ == "__main__":
    main()
