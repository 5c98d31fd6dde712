"""Helpers of benchmarks/gpu_check.sh: the environment, the attention kernel actually run, and
one result line per training run read from the metrics.jsonl the trainer writes.

    python benchmarks/gpu_check_report.py env
    python benchmarks/gpu_check_report.py attention DEVICE [--section.field VALUE ...]
    python benchmarks/gpu_check_report.py run LABEL RUN_DIR WALL_S ROWS_JSONL LOG
    python benchmarks/gpu_check_report.py table ROWS_JSONL
"""

from __future__ import annotations

import json
import platform
import re
import statistics
import sys
from pathlib import Path


def env() -> str:
    import torch

    lines = [f"- Python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})"]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            lines.append(f"- cuda:{i}: {p.name}, capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB")
    else:
        lines.append(f"- no CUDA device; CPU: {platform.processor() or platform.machine()}")
    try:
        import torchao

        lines.append(f"- torchao {torchao.__version__}")
    except ImportError:
        lines.append("- torchao not installed (the float8 section is skipped)")
    return "\n".join(lines)


def attention(device_name: str, preset: str, overrides: list[str]) -> str:
    """Profile one forward of a 1-block model of the preset's shape and name the attention kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from hlat.config.load import load_config
    from hlat.model import Llama
    from hlat.precision import autocast

    cfg = load_config(preset, overrides=overrides + ["--model.n_layers", "1"])
    device = torch.device(device_name)
    model = Llama(cfg.model).to(device)
    tokens = torch.randint(0, cfg.model.vocab_size, (1, cfg.data.seq_len), device=device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.no_grad(), autocast(cfg.precision.mode, device):
        model(tokens)  # warm-up: lazy initialisation stays out of the trace
        with profile(activities=activities) as prof:
            model(tokens)
    keys = ("attention", "flash", "fmha", "cudnn", "sdpa", "flex")
    names = sorted({e.key for e in prof.key_averages() if any(k in e.key.lower() for k in keys)})
    masking = "document masking (flex_attention)" if cfg.data.document_masking else "causal"
    return (
        f"- {preset}: {masking}, {cfg.precision.mode}, seq {cfg.data.seq_len}, head_dim {cfg.model.attn_head_dim}: "
        + ("; ".join(f"`{n[:90]}`" for n in names) or "no attention kernel seen")
    )


def _stamped(log: Path, pattern: str) -> list[tuple[float, str]]:
    """(seconds, text) of the lines of a gpu_check.sh log ("  12.3 | text") whose text matches."""
    hits = []
    for line in log.read_text(errors="replace").splitlines() if log.is_file() else []:
        stamp, _, text = line.partition(" | ")
        if re.search(pattern, text):
            hits.append((float(stamp), text))
    return hits


def run(label: str, run_dir: Path, wall_s: float, rows: Path, log: Path) -> str:
    """One line for a training run: medians over the steps after the first (compilation and
    warm-up land in step 1); start-up = when the first step's record was printed, less its time."""
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    if not records:
        return f"- {label}: no metrics.jsonl records (see logs/{log.name})"
    steady = records[1:] or records
    tps = statistics.median(r["tokens_per_s"] for r in steady)
    mfus = [r["mfu"] for r in steady if r.get("mfu") is not None]
    mfu = statistics.median(mfus) if mfus else None
    mem = max(r["mem_peak_gib"] for r in records)
    first, later = records[0]["step_s"], statistics.median(r["step_s"] for r in steady)
    step_lines = _stamped(log, r"^step\s+\d+ \| loss")
    startup = (step_lines[0][0] if step_lines else wall_s) - first
    compile_line = next((text for _, text in _stamped(log, r"^compile: ")), "compile: ?")
    saves = [text for _, text in _stamped(log, r"^checkpoint: ")]
    row = {
        "label": label,
        "tokens_per_s": tps,
        "mfu": mfu,
        "mem_peak_gib": mem,
        "step_s": later,
        "first_step_s": first,
        "startup_s": startup,
        "wall_s": wall_s,
        "steps": len(records),
    }
    with rows.open("a") as f:
        f.write(json.dumps(row) + "\n")
    mfu_text = f"{mfu:.1%}" if mfu is not None else "n/a"
    save = f"; {saves[-1]}" if saves else ""
    return (
        f"- {label}: {tps:,.0f} tokens/s, MFU {mfu_text}, peak {mem:.2f} GiB, {later:.3f} s/step "
        f"(first step {first:.1f} s), start-up {startup:.1f} s, wall {wall_s:.0f} s, {len(records)} steps; "
        f"{compile_line}{save}"
    )


def table(rows: Path) -> str:
    out = [
        "| run | tokens/s | MFU | peak GiB | s/step | first step s | start-up s | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for line in rows.read_text().splitlines() if rows.is_file() else []:
        r = json.loads(line)
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        out.append(
            f"| {r['label']} | {r['tokens_per_s']:,.0f} | {mfu} | {r['mem_peak_gib']:.2f} | {r['step_s']:.3f} | "
            f"{r['first_step_s']:.1f} | {r['startup_s']:.1f} | {r['wall_s']:.0f} |"
        )
    return "\n".join(out)


def main(argv: list[str]) -> None:
    command, args = argv[0], argv[1:]
    if command == "env":
        print(env())
    elif command == "attention":
        for preset in ("1b", "hlat-7b"):  # one process: one import of torch for both
            print(attention(args[0], preset, args[1:]))
    elif command == "run":
        print(run(args[0], Path(args[1]), float(args[2]), Path(args[3]), Path(args[4])))
    elif command == "table":
        print(table(Path(args[0])))
    else:
        sys.exit(f"unknown command {command!r}; see the docstring")


if __name__ == "__main__":
    main(sys.argv[1:])
