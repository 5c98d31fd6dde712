"""Results on disk and on screen: a JSON file, per-example samples, a markdown table, baselines."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hlat.atomic_files import atomic_path, write_atomic
from hlat.eval.harness import TaskResult

Baselines = dict[str, dict[str, dict[str, float]]]  # model -> task -> metric -> value


def results_dict(results: Sequence[TaskResult], skipped: dict[str, str], meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "tasks": {r.task: r.summary() for r in results}, "skipped": skipped}


def write_results(
    out_dir: Path,
    data: dict[str, Any],
    results: Sequence[TaskResult],
    baselines: Baselines | None = None,
    log_samples: bool = False,
) -> Path:
    """results.json, results.md and, with log_samples, samples_<task>.jsonl; returns the JSON."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    write_atomic(path, json.dumps(data, indent=1))
    write_atomic(out_dir / "results.md", markdown_table(data, baselines) + "\n")
    if log_samples:
        write_samples(out_dir, results)
    return path


def write_samples(out_dir: Path, results: Sequence[TaskResult]) -> None:
    """samples_<task>.jsonl: one record per evaluated example, in document order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for r in results:
        with (
            atomic_path(out_dir / f"samples_{r.task}.jsonl") as temporary,
            open(temporary, "w", encoding="utf-8") as handle,
        ):
            for i, sample in enumerate(r.samples):
                handle.write(json.dumps({"doc": i, **sample}, default=str) + "\n")


def load_baselines(path: str | Path) -> Baselines:
    """A JSON file {"LLaMA-2 7B": {"arc_easy": {"acc": 0.762}, ...}, ...}: fractions, as in
    results.json (not percentages)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--baseline {path}: cannot read it as JSON ({err})") from err
    ok = isinstance(data, dict) and all(
        isinstance(tasks, dict) and all(isinstance(m, dict) for m in tasks.values()) for tasks in data.values()
    )
    if not ok:
        raise ValueError(
            f"--baseline {path}: expected {{model: {{task: {{metric: value}}}}}}, "
            'e.g. {"LLaMA-2 7B": {"arc_easy": {"acc": 0.762}}}'
        )
    for model, tasks in data.items():
        for task, metrics in tasks.items():
            for metric, value in metrics.items():
                if not isinstance(value, (int, float)) or (
                    metric.startswith(("acc", "exact", "pass")) and not 0 <= value <= 1
                ):
                    raise ValueError(
                        f"--baseline {path}: {model}/{task}/{metric} = {value!r}; "
                        "give fractions in [0, 1] (0.762, not 76.2)"
                    )
    return data


def markdown_table(data: dict[str, Any], baselines: Baselines | None = None) -> str:
    """One row per (task, metric): our value ± stderr, then each baseline's value."""
    names = list(baselines or {})
    header = ["task", "family", "metric", "shots", "n", str(data.get("model", "model"))] + names
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for task, r in data["tasks"].items():
        for metric, v in r["metrics"].items():
            ours = f"{v['value']:.4f}" + (f" ± {v['stderr']:.4f}" if v["stderr"] else "")
            theirs = [_fmt((baselines or {})[b].get(task, {}).get(metric)) for b in names]
            lines.append(
                "| " + " | ".join([task, r["family"], metric, str(r["shots"]), str(r["n"]), ours, *theirs]) + " |"
            )
    for task, why in data.get("skipped", {}).items():
        lines.append(f"\nskipped {task}: {why}")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"
