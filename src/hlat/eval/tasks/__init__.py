"""The task registry and the named suites."""

from __future__ import annotations

from hlat.eval.tasks import code, generation, multiple_choice, perplexity
from hlat.eval.tasks.base import Dataset, Doc, Task, choose_shots
from hlat.eval.tasks.data import DataMissing, load_split

TASKS: dict[str, Task] = {t.name: t for m in (multiple_choice, generation, code, perplexity)
                          for t in m.TASKS}

COMMONSENSE = ("arc_easy", "arc_challenge", "boolq", "hellaswag", "openbookqa", "piqa", "siqa",
               "winogrande")
SUITES: dict[str, tuple[str, ...]] = {
    # the paper's table: MMLU, BBH, commonsense reasoning, world knowledge, math, code
    "hlat": ("mmlu", "bbh", *COMMONSENSE, "nq_open", "triviaqa", "gsm8k", "humaneval", "mbpp"),
    "commonsense": COMMONSENSE,
    "code": ("humaneval", "mbpp"),
}


def resolve_tasks(tasks: str | None = None, suite: str | None = None) -> list[Task]:
    """Tasks named by a comma-separated list and/or a suite, in order, without repeats."""
    if suite and suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
    names: list[str] = list(SUITES[suite]) if suite else []
    names += [n.strip() for n in (tasks or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(TASKS)}")
    if not names:
        raise ValueError("no tasks: pass --tasks a,b,c or --suite " + "|".join(SUITES))
    return [TASKS[n] for n in dict.fromkeys(names)]


__all__ = ["DataMissing", "Dataset", "Doc", "SUITES", "TASKS", "Task", "choose_shots",
           "load_split", "resolve_tasks"]
