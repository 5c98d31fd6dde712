"""Evaluation: the HLAT benchmark suite on hlat or Hugging Face checkpoints, during and after
training. `hlat eval` is the command; these are the pieces it is built from.

The names below load on first use (PEP 562): the task registry (hlat.eval.tasks), which `hlat
train` reads to check eval.tasks before torch is imported, must not pull in the scoring stack."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hlat.eval.harness import EvalOptions, TaskResult, evaluate, evaluate_task
    from hlat.eval.lm import LanguageModel
    from hlat.eval.requests import GenerateRequest, LoglikelihoodRequest, RollingRequest
    from hlat.eval.sandbox import ExecResult, Program, SandboxLimits, run_program, run_programs
    from hlat.eval.tasks import SUITES, TASKS, Task, resolve_tasks

_MODULES = ("harness", "lm", "requests", "sandbox", "tasks")  # where the names of __all__ live


def __getattr__(name: str) -> Any:
    if name in __all__:
        for module in _MODULES:
            found = importlib.import_module(f"hlat.eval.{module}")
            if hasattr(found, name):
                return getattr(found, name)
    raise AttributeError(f"module 'hlat.eval' has no attribute {name!r}")


__all__ = [
    "EvalOptions",
    "ExecResult",
    "GenerateRequest",
    "LanguageModel",
    "LoglikelihoodRequest",
    "Program",
    "RollingRequest",
    "SUITES",
    "SandboxLimits",
    "TASKS",
    "Task",
    "TaskResult",
    "evaluate",
    "evaluate_task",
    "resolve_tasks",
    "run_program",
    "run_programs",
]
