"""Quality over training: evaluate every saved checkpoint of a run and plot each metric against
the tokens seen, as the paper tracked its intermediate checkpoints."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hlat.atomic_files import atomic_path, write_atomic
from hlat.checkpoint.errors import CheckpointError
from hlat.checkpoint.loading import LoadedModel, load_hlat_checkpoint, run_checkpoints, run_tokenizer
from hlat.config.load import read_run_config
from hlat.eval.harness import EvalOptions, evaluate
from hlat.eval.lm import LanguageModel
from hlat.eval.results import write_samples
from hlat.eval.tasks import Task

SWEEP_JSON = "sweep.json"
SWEEP_PNG = "sweep.png"


def sweep_run(
    run_dir: Path,
    tasks: Sequence[Task],
    options: EvalOptions,
    make_lm: Callable[[LoadedModel], LanguageModel],
    tokenizer: str | Path | None = None,
    log: Callable[[str], None] = print,
    samples_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """One row per checkpoint, oldest first: {checkpoint, step, tokens, tasks: {task: summary}}.
    With samples_dir, each checkpoint's per-example records go to <samples_dir>/<checkpoint>/."""
    run = read_run_config(run_dir)
    model_cfg, data_cfg = run.model, run.data
    tok = run_tokenizer(run_dir, data_cfg, model_cfg.vocab_size, tokenizer)
    checkpoints = run_checkpoints(run_dir)
    if not checkpoints:
        raise FileNotFoundError(f"{run_dir} has no checkpoints under checkpoints/")
    rows = []
    for i, checkpoint in enumerate(checkpoints):
        try:
            loaded = load_hlat_checkpoint(checkpoint, cached=(model_cfg, data_cfg, tok))
        except CheckpointError as err:  # corrupt or partial: skipped and named, as training skips it
            log(f"[{i + 1}/{len(checkpoints)}] {checkpoint.name}: skipped: {err}")
            continue
        log(f"[{i + 1}/{len(checkpoints)}] {checkpoint.name}: step {loaded.step}, {loaded.tokens} tokens")
        results, skipped = evaluate(make_lm(loaded), tasks, options, log)
        if samples_dir is not None:
            write_samples(samples_dir / checkpoint.name, results)
        rows.append(
            {
                "checkpoint": checkpoint.name,
                "step": loaded.step,
                "tokens": loaded.tokens,
                "tasks": {r.task: r.summary() for r in results},
                "skipped": skipped,
            }
        )
    if not rows:
        raise CheckpointError(f"{run_dir}: no checkpoint passes verification (each named above)")
    return rows


def write_sweep(rows: list[dict[str, Any]], out_dir: Path, title: str) -> tuple[Path, Path]:
    """sweep.json and sweep.png (one panel per task and metric, value ± stderr vs tokens)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / SWEEP_JSON, json.dumps(rows, indent=1))
    series: dict[str, list[tuple[float, float, float]]] = {}
    for row in rows:
        x = row["tokens"] if row["tokens"] is not None else row["step"]
        for task, summary in row["tasks"].items():
            for metric, v in summary["metrics"].items():
                series.setdefault(f"{task} {metric}", []).append((x, v["value"], v["stderr"] or 0.0))
    cols = min(3, max(1, len(series)))
    nrows = max(1, math.ceil(len(series) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 3.2 * nrows), squeeze=False)
    for ax, (name, points) in zip(axes.flat, sorted(series.items())):
        xs, ys, errs = zip(*points)
        ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("tokens seen")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(series) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    png = out_dir / SWEEP_PNG
    with atomic_path(png) as temporary:
        fig.savefig(temporary, dpi=110, format="png")
    plt.close(fig)
    return out_dir / SWEEP_JSON, png
