"""Evaluate a language model on a list of tasks and collect the results.

Few-shot prompts are deterministic: example i of a task always gets the same shots for a given
seed (see choose_shots), so a prompt hash in the results identifies exactly what was asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hlat.digests import short_sha256
from hlat.eval.lm import LanguageModel
from hlat.eval.metrics import loglikelihood_perplexity, mean_stderr, perplexity_metrics
from hlat.eval.sandbox import SandboxLimits, isolation_mode, isolation_summary
from hlat.eval.scoring import score_code, score_generation, score_loglikelihood, score_multiple_choice, score_perplexity
from hlat.eval.tasks import DataMissing, Doc, Task, choose_shots, load_split


@dataclass
class EvalOptions:
    data_dir: Path | None = None  # local task files; None = the hub (and bundled HumanEval)
    limit: int | None = None  # first N examples of each task
    num_fewshot: int | None = None  # overrides every task's shot count
    seed: int = 1234  # few-shot selection
    samples: int = 1  # code: completions per problem (pass@k for k <= samples)
    temperature: float = 0.0  # code: sampling temperature when samples > 1
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)
    workers: int = 4  # code: programs run in parallel
    allow_unsafe_code: bool = False  # code: run programs even where the sandbox has no isolation


@dataclass
class TaskResult:
    task: str
    family: str  # the task's category, under the results JSON's key "family"
    metrics: dict[str, dict[str, float | None]]  # metric -> {"value", "stderr"}
    n: int
    shots: int
    prompt_hash: str  # sha256 of every prompt, in order
    seconds: float
    notes: list[str]
    samples: list[dict[str, Any]] = field(repr=False, default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Everything but the per-example samples (the results JSON)."""
        out = asdict(self)
        out.pop("samples")
        return out


def evaluate(
    lm: LanguageModel, tasks: Sequence[Task], options: EvalOptions, log: Callable[[str], None] = print
) -> tuple[list[TaskResult], dict[str, str]]:
    """(results of the tasks that ran, {task: why it was skipped}). A task without available data
    is skipped with its reason; any other error propagates."""
    results, skipped = [], {}
    for task in tasks:
        try:
            result = evaluate_task(lm, task, options)
        except DataMissing as err:
            skipped[task.name] = str(err)
            log(f"skipped {task.name}: {err}")
            continue
        results.append(result)
        values = ", ".join(f"{m} {v['value']:.4f}" for m, v in result.metrics.items())
        log(f"{task.name}: {values} (n={result.n}, {result.shots}-shot, {result.seconds:.1f} s)")
    return results, skipped


def evaluate_task(lm: LanguageModel, task: Task, options: EvalOptions) -> TaskResult:
    t0 = time.perf_counter()
    docs, pool, same_split, notes = _load_docs(task, options)
    shots = task.num_fewshot if options.num_fewshot is None else options.num_fewshot
    if task.kind == "perplexity":
        shots = 0
    prompts = [
        task.prompt(doc, choose_shots(task, i, doc, pool, shots, options.seed, same_split))
        for i, doc in enumerate(docs)
    ]
    if task.kind == "multiple_choice":
        scores, samples = score_multiple_choice(lm, task, docs, prompts)
    elif task.kind == "loglikelihood":
        scores, samples = score_loglikelihood(lm, task, docs, prompts)
    elif task.kind == "generate":
        scores, samples = score_generation(lm, task, docs, prompts)
    elif task.kind == "code":
        scores, samples = score_code(
            lm,
            task,
            docs,
            prompts,
            options.samples,
            options.temperature,
            options.sandbox,
            options.workers,
            options.allow_unsafe_code,
        )
        notes.append(f"code isolation: {isolation_summary(isolation_mode())}")
    else:
        scores, samples = score_perplexity(lm, task, docs)
    if task.kind == "perplexity":
        totals = perplexity_metrics(
            [s["loglikelihood"] for s in scores], [int(s["words"]) for s in scores], [int(s["bytes"]) for s in scores]
        )
        metrics = {m: {"value": totals[m], "stderr": None} for m in task.metrics}
    else:
        metrics = {
            m: {"value": sum(s[m] for s in scores) / max(len(scores), 1), "stderr": mean_stderr([s[m] for s in scores])}
            for m in scores[0]
        }
        if "perplexity" in metrics:  # of a loglikelihood task: per-example log-likelihoods
            metrics["perplexity"] = {
                "value": loglikelihood_perplexity([s["perplexity"] for s in scores]),
                "stderr": None,
            }
    digest = short_sha256("\x00".join(prompts))
    if task.notes:
        notes.insert(0, task.notes)
    return TaskResult(
        task.name, task.category, metrics, len(docs), shots, digest, time.perf_counter() - t0, notes, samples
    )


def _load_docs(task: Task, options: EvalOptions) -> tuple[list[Doc], list[Doc], bool, list[str]]:
    """(examples to score, few-shot pool, whether the pool is the evaluated split, notes)."""
    notes: list[str] = []
    docs = load_split(task.data, task.data.split, options.data_dir)
    if task.process_docs is not None:
        docs = task.process_docs(docs)
    if not docs:
        raise DataMissing(f"{task.name}: the {task.data.split} split is empty")
    pool, same_split = docs, True
    wants_shots = (task.num_fewshot if options.num_fewshot is None else options.num_fewshot) > 0
    if wants_shots and task.data.fewshot_split and task.kind != "perplexity":
        try:
            pool = load_split(task.data, task.data.fewshot_split, options.data_dir)
            pool = task.process_docs(pool) if task.process_docs else pool
            same_split = False
        except DataMissing:
            notes.append(
                f"few-shot split {task.data.fewshot_split!r} unavailable: shots drawn "
                f"from {task.data.split!r}, never the example itself"
            )
    if task.fewshot_docs is not None:
        pool = task.fewshot_docs(pool)
    if options.limit is not None:
        docs = docs[: options.limit]
    return docs, pool, same_split, notes
