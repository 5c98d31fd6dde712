"""Time lost to one failure: an elastic run (torchft replica groups, hlat.train.elastic) against a
full restart from the last checkpoint, on the same CPU model, batch and steps.

- elastic: `--groups` groups of one process at a lighthouse in this process; group 1 is killed
  (SIGKILL, hlat.faults) before step `--kill` and restarted at once, as a supervisor
  would; the others go on. Lost: the survivors' wall time over an uninterrupted elastic run's;
  steps redone: committed (step, share) records beyond one per share per step; seconds to rejoin:
  from the kill to the restarted group's first committed step (its token record).
- restart: one process (no elastic) with `--checkpoint-every`, killed before step `--kill` and
  run again with the same command, which resumes from the last checkpoint. Lost: the two
  invocations' wall time over an uninterrupted run's; steps redone: those after the last checkpoint.

Both sides are what each launch costs on this machine (imports, data, model build included).
Writes markdown with `--out`.

    python benchmarks/elastic_recovery.py --steps 200 --out benchmarks/elastic_recovery.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from run_conditions import Conditions
from torchft.coordination import LighthouseServer

from hlat.train.elastic.secret import create_secret

MODEL = [
    "--model.vocab_size", "512", "--model.d_model", "64", "--model.n_layers", "2", "--model.n_heads", "4",
    "--model.n_kv_heads", "2", "--model.ffn_dim", "128", "--model.max_seq_len", "64", "--data.seq_len", "32",
    "--train.micro_batch", "1", "--train.log_every", "1", "--precision.mode", "fp32", "--parallel.compile", "false",
    "--train.tensorboard", "false", "--train.plot", "false", "--train.peak_tflops", "1", "--eval.every", "0",
    "--train.sample_prompt", "",
]  # fmt: skip


def hlat_train(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    # HLAT_FAULT acts only under HLAT_TESTING=1 (hlat.faults)
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "HLAT_TESTING": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "hlat", "train", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=environ
    )


def finish(proc: subprocess.Popen, want: int = 0) -> None:
    _, err = proc.communicate()
    if proc.returncode != want:
        raise SystemExit(f"hlat train exited {proc.returncode} (wanted {want}):\n{err.decode()[-3000:]}")


def elastic(base: list[str], root: Path, groups: int, kill: int | None) -> dict[str, float]:
    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=10_000, heartbeat_timeout_ms=1500)
    secret = root / "run.secret"  # the default: groups prove a shared secret (hlat elastic-secret)
    root.mkdir(parents=True, exist_ok=True)
    if not secret.exists():
        create_secret(secret)

    def group(g: int, env: dict[str, str]) -> subprocess.Popen:
        args = [*base, "--train.run_dir", str(root / f"group{g}"), "--elastic.enabled", "true"]
        args += ["--elastic.lighthouse", server.address(), "--elastic.group", str(g)]
        args += ["--elastic.max_groups", str(groups), "--elastic.timeout_s", "30", "--elastic.secret_file", str(secret)]
        return hlat_train(args, {"HLAT_ELASTIC_HOLD": f"1:{groups}", **env})

    start = time.perf_counter()
    fault = {"HLAT_FAULT": f"step:{kill}:0", "HLAT_FAULT_MARKER": str(root / "killed")} if kill else {}
    procs = [group(g, fault if g == 1 else {}) for g in range(groups)]
    out: dict[str, float] = {}
    if kill:
        finish(procs[1], -9)
        killed_at = time.time()
        procs[1] = group(1, {})
    for proc in procs:
        finish(proc)
    out["wall_s"] = time.perf_counter() - start
    records = [json.loads(x) for f in root.glob("group*/tokens.*.jsonl") for x in f.read_text().splitlines()]
    out["redone"] = len(records) - len({(r["step"], r["share"]) for r in records})
    if kill:
        back = [r["time"] for r in records if r["group"] == "1" and r["pid"] == procs[1].pid]
        if not back or min(r["step"] for r in records if r["pid"] == procs[1].pid) == 1:
            raise SystemExit("the restarted group did not rejoin before the others finished: raise --steps")
        out["rejoin_s"] = min(back) - killed_at
    server.shutdown()
    return out


def restart(base: list[str], root: Path, every: int, kill: int | None) -> dict[str, float]:
    args = [*base, "--train.run_dir", str(root), "--checkpoint.every", str(every)]
    start = time.perf_counter()
    if kill:
        finish(hlat_train(args, {"HLAT_FAULT": f"step:{kill}:0", "HLAT_FAULT_MARKER": str(root / "killed")}), -9)
    finish(hlat_train(args))
    return {"wall_s": time.perf_counter() - start, "redone": float((kill - 1) % every) if kill else 0.0}


def stdlib_corpus(root: Path) -> Path:
    """The tests' small corpus: 60 modules of Python's standard library."""
    root.mkdir(parents=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for i, path in enumerate(sorted(p for p in stdlib.glob("*.py") if 2_000 < p.stat().st_size < 40_000)[:60]):
        shutil.copy(path, root / f"{i:03d}_{path.stem}.py")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, help="a directory of text files (default: 60 standard-library modules)")
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="enough for the killed group to be back before the end")
    parser.add_argument("--kill", type=int, default=9, help="the step before which one process is killed")
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--out", type=Path)
    opts = parser.parse_args()
    conditions = Conditions()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = opts.corpus or stdlib_corpus(root / "corpus")
        base = [*MODEL, "--data.source", str(corpus), "--train.steps", str(opts.steps)]
        base += ["--train.global_batch", str(2 * opts.groups)]
        runs = {
            "elastic": (
                elastic(base, root / "e0", opts.groups, None),
                elastic(base, root / "e1", opts.groups, opts.kill),
            ),
            "restart": (
                restart(base, root / "r0", opts.checkpoint_every, None),
                restart(base, root / "r1", opts.checkpoint_every, opts.kill),
            ),
        }
    lines = [
        "# Time lost to one failure: elastic replica groups vs restart from the last checkpoint",
        "",
        *conditions.lines(),
        f"- run: {opts.steps} steps of {2 * opts.groups} x 32 tokens, a 0.1M-parameter model, fp32, eager; one process "
        f"killed (SIGKILL) before step {opts.kill}",
        f"- elastic: {opts.groups} groups of one process, the killed one restarted at once; restart: one process, "
        f"checkpoint every {opts.checkpoint_every} steps, run again after the kill",
        "",
        "| mode | uninterrupted wall s | with the failure wall s | time lost s | steps redone | seconds to rejoin |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode, (straight, faulty) in runs.items():
        rejoin = f"{faulty['rejoin_s']:.1f}" if "rejoin_s" in faulty else "- (all stop)"
        lines.append(
            f"| {mode} | {straight['wall_s']:.1f} | {faulty['wall_s']:.1f} | {faulty['wall_s'] - straight['wall_s']:.1f} "
            f"| {faulty['redone']:.0f} | {rejoin} |"
        )
    lines += [
        "",
        "Time lost includes the start-up of the processes launched again (imports, data, model build), which "
        "dominates at this size; at scale the restart also reloads the checkpoint and redoes the steps since it, "
        "while the survivors of an elastic run lose only the steps that did not commit and the rejoining group's "
        "state transfer.",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if opts.out:
        opts.out.write_text(report)


if __name__ == "__main__":
    main()
