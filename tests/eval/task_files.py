"""Tiny local task files for the evaluation tests."""

from __future__ import annotations

import json
from pathlib import Path

TEXT = [
    "Question: What is the capital of France?\nAnswer: Paris",
    "The quick brown fox jumps over the lazy dog. A man is sitting on a roof.",
    "def add(a, b):\n    return a + b\n",
    "Photosynthesis turns light into chemical energy in plants and algae.",
    "Which tool is best for cutting wood? A saw. Which for nails? A hammer.",
] * 20


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ARC_ROWS = [
    {"id": f"q{i}", "question": q, "answerKey": key, "choices": {"label": ["A", "B", "C"], "text": choices}}
    for i, (q, choices, key) in enumerate(
        [
            ("What is the capital of France?", ["Paris", "a dog", "the roof"], "A"),
            ("Which tool cuts wood?", ["a hammer", "a saw", "light"], "B"),
            ("What do plants turn light into?", ["nails", "foxes", "chemical energy"], "C"),
            ("Which animal is quick and brown?", ["the fox", "the algae", "Paris"], "A"),
            ("Where is the man sitting?", ["on a roof", "in France", "on a saw"], "A"),
            ("What does add return?", ["a + b", "wood", "the dog"], "A"),
        ]
    )
]


def write_tiny_tasks(root: Path) -> Path:
    """Local files of two tiny tasks: arc_easy (multiple choice) and perplexity (rolling)."""
    write_jsonl(root / "arc_easy" / "test.jsonl", ARC_ROWS)
    write_jsonl(root / "perplexity" / "test.jsonl", [{"text": text} for text in TEXT[:5]])
    return root


def tiny_tasks_scenario(ctx) -> None:
    """Scenario (tests/runs.py): the two tiny tasks under OUT/tasks, for runs in the shared launch."""
    write_tiny_tasks(ctx.out / "tasks")
