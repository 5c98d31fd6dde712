"""The task registry and the named suites."""

from __future__ import annotations

from collections.abc import Sequence

from hlat.config.run import RunConfig
from hlat.eval.tasks import code, generation, multiple_choice, perplexity
from hlat.eval.tasks.base import Dataset, Doc, Task, choose_shots
from hlat.eval.tasks.data import DataMissing, load_split

TASKS: dict[str, Task] = {t.name: t for m in (multiple_choice, generation, code, perplexity) for t in m.TASKS}

COMMONSENSE = ("arc_easy", "arc_challenge", "boolq", "hellaswag", "openbookqa", "piqa", "siqa", "winogrande")
SUITES: dict[str, tuple[str, ...]] = {
    # the paper's table: MMLU, BBH, commonsense reasoning, world knowledge, math, code
    "hlat": ("mmlu", "bbh", *COMMONSENSE, "nq_open", "triviaqa", "gsm8k", "humaneval", "mbpp"),
    "commonsense": COMMONSENSE,
    "code": ("humaneval", "mbpp"),
}


def task_name_problems(cfg: RunConfig) -> list[tuple[str, str]]:
    """eval.tasks names no unknown task: a check load_config runs for `hlat train` (the registry
    imports the scoring stack, which the configuration package does not)."""
    unknown = [name for name in cfg.eval.task_names() if name not in TASKS]
    return [("eval.tasks", f"unknown task(s) {', '.join(unknown)}; known: {', '.join(TASKS)}")] if unknown else []


def resolve_tasks(tasks: str | None = None, suite: str | None = None, task_files: Sequence[Task] = ()) -> list[Task]:
    """Tasks named by a comma-separated list and/or a suite, in order, without repeats, then the
    tasks read from task files (hlat.eval.tasks.task_file)."""
    if suite and suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
    names: list[str] = list(SUITES[suite]) if suite else []
    names += [n.strip() for n in (tasks or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(TASKS)}")
    if not names and not task_files:
        raise ValueError("no tasks: pass --tasks a,b,c, --suite " + "|".join(SUITES) + " or --task-file FILE.yaml")
    chosen = [TASKS[n] for n in dict.fromkeys(names)]
    from_files = [t.name for t in task_files]
    clash = sorted({n for n in from_files if n in names or from_files.count(n) > 1})
    if clash:
        raise ValueError(
            f"task name(s) {', '.join(clash)} given twice (a task file's `task:` "
            "names its results); rename the task in its file"
        )
    return chosen + list(task_files)


__all__ = ["DataMissing", "Dataset", "Doc", "SUITES", "TASKS", "Task", "choose_shots", "load_split", "resolve_tasks"]
