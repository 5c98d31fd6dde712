"""One check of a single-GPU machine in at most 9 minutes, offline: what the first GPU session must
learn, in priority order, each stage in its own process under its own deadline.

    python3 benchmarks/gpu_check.py [--cpu-dry-run] [OUT_DIR]     (benchmarks/gpu_check.sh wraps it)

1. env: versions, the device and its row of hlat.accelerators, a bf16 GEMM, the SDPA kernels the
   `1b` and `hlat-7b` attention shapes run with gradients;
2. parity: hlat's step on the GPU against the same step on the CPU in fp32 (fp32 eager, a
   deterministic repeat, document masking with FlexAttention and `selective` recompute against the
   CPU's dense mask, mixed / bf16-sr / float8 compiled);
3. throughput: synthetic batches through hlat's parallelized model, optimizer and step (`1b`
   eager and compiled, a 4-layer `hlat-7b` slice, `1b` with document masking, float8, micro-batch
   8): tokens/s, MFU against the table's peak, first-step time, peak memory, first loss;
4. switches: the speed switches on and off (selective recompute replaying or saving fused
   attention, mixed's bf16 weight cache over 4 micro-batches (2 in the dry run), float8 on the 4-layer `hlat-7b`
   slice, inductor's autotuned GEMMs on `1b`), each against its "off" row, first losses agreeing;
   the SDPA backends (train.attention_backend) are timed per shape in env;
5. end_to_end: `hlat train` (tiny) + resume + `hlat generate` through the CLI.

OUT_DIR (else $OUT, else ./gpu_check_out) receives three files: gpu_check.md (the report),
gpu_check.jsonl (one row per check, and one per stage) and gpu_check_logs.tar.gz (each stage's
output). `--cpu-dry-run` runs every stage on the CPU at toy sizes, everything compiled with the
aot_eager backend (no inductor code generation): a rehearsal, not data.

Offline extras: wheels put in benchmarks/wheels/ (torchao for the float8 rows, matching the GPU's
torch) are installed into the run's scratch directory, never into the machine's Python:
    python3 -m pip download --no-deps --only-binary=:all: -d benchmarks/wheels torchao==VERSION
The stages share one compiler cache in the scratch directory (a kernel compiled once is reused by
the stages after it). This driver imports no torch; benchmarks/gpu_check_stages.py runs each
stage in a process of its own, so a stage that crashes or hangs costs only its own deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHEELS = HERE / "wheels"
TOTAL_S = 530  # under the 9-minute call, leaving the report and archive their seconds
# (stage, deadline on the GPU, in the dry run) in priority order; the deadlines sum to TOTAL_S.
STAGES = [("env", 45, 40), ("parity", 130, 60), ("throughput", 195, 90), ("switches", 90, 60), ("end_to_end", 70, 60)]
REPORT, RESULTS, LOGS = "gpu_check.md", "gpu_check.jsonl", "gpu_check_logs.tar.gz"


def report(rows: list[dict], dry: bool, total_s: float) -> str:
    """The markdown report: one table per stage, the stage's own row first."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# GPU check, {when}" + (" -- CPU DRY RUN: toy sizes, not GPU data" if dry else ""),
        "",
        f"Total {total_s:.0f} s (budget {TOTAL_S} s). Status per check: ok, fail (outside its tolerance), "
        "skip (not possible here, with why), error, timeout. Every row is in gpu_check.jsonl.",
    ]
    for stage, *_ in STAGES:
        own = [r for r in rows if r["stage"] == stage]
        summary = next((r for r in own if r["check"] == "stage"), {"status": "not run", "wall_s": 0})
        lines += ["", f"## {stage}: {summary['status']}, {summary['wall_s']} s", ""]
        checks = [r for r in own if r["check"] != "stage"]
        if not checks:
            lines.append("no result (see its log in gpu_check_logs.tar.gz)")
            continue
        lines += ["| check | status | results |", "|---|---|---|"]
        for r in checks:
            fields = {k: v for k, v in r.items() if k not in ("stage", "check", "status")}
            text = "; ".join(f"{k} {_short(v)}" for k, v in fields.items())
            lines.append(f"| {r['check']} | {r['status']} | {text.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _short(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def stage_env(scratch: Path) -> dict[str, str]:
    """The stages' environment: one compiler cache for all of them, and the wheels of WHEELS
    installed into `scratch` (without their dependencies, from no index) ahead of the machine's own."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(scratch / "compile_cache")}
    env["TRITON_CACHE_DIR"] = str(scratch / "compile_cache" / "triton")
    wheels = sorted(WHEELS.glob("*.whl"))
    if wheels:
        site = scratch / "site"
        install = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        done = subprocess.run([*install, "--target", str(site), *map(str, wheels)], capture_output=True, text=True)
        names = ", ".join(w.name for w in wheels)
        if done.returncode == 0:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
            print(f"gpu_check: installed for this run: {names}", flush=True)
        else:
            print(f"gpu_check: could not install {names}: {done.stderr.strip()[-300:]}", flush=True)
    return env


def main(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        return 0
    dry = "--cpu-dry-run" in argv
    positional = [a for a in argv if not a.startswith("--")]
    out = Path(positional[0] if positional else os.environ.get("OUT") or "gpu_check_out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = out / RESULTS
    results.unlink(missing_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hlat_gpu_check_") as tmp:
        logs, work = Path(tmp) / "logs", Path(tmp) / "work"
        logs.mkdir()
        plan = ",".join(f"{name}:{dry_s if dry else gpu_s}" for name, gpu_s, dry_s in STAGES)
        argv = [
            sys.executable,
            str(HERE / "gpu_check_stages.py"),
            plan,
            str(TOTAL_S),
            str(results),
            str(logs),
            str(work),
        ]
        env = stage_env(Path(tmp))
        try:  # the stages keep their deadlines themselves; this one is the last resort
            done = subprocess.run(argv + (["--cpu-dry-run"] if dry else []), env=env, timeout=TOTAL_S + 30, check=False)
            if done.returncode != 0:
                print(f"gpu_check: the stages' host exited {done.returncode} (its error is above)", flush=True)
        except subprocess.TimeoutExpired:
            print("gpu_check: the stages overran the total budget; reporting what they wrote", flush=True)
        with tarfile.open(out / LOGS, "w:gz") as archive:
            archive.add(logs, arcname="logs")
    text = results.read_text() if results.exists() else ""  # empty where the host failed before any stage
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    (out / REPORT).write_text(report(rows, dry, time.monotonic() - start))
    print(f"gpu_check: {out / REPORT}, {out / RESULTS}, {out / LOGS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
