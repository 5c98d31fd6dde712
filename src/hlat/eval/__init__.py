"""Evaluation: the HLAT benchmark suite on hlat or Hugging Face checkpoints, during and after
training. `hlat eval` is the command; these are the pieces it is built from."""

from hlat.eval.harness import EvalOptions, TaskResult, evaluate, evaluate_task
from hlat.eval.lm import LanguageModel
from hlat.eval.requests import GenerateRequest, LoglikelihoodRequest, RollingRequest
from hlat.eval.sandbox import ExecResult, Program, SandboxLimits, run_program, run_programs
from hlat.eval.tasks import SUITES, TASKS, Task, resolve_tasks

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
