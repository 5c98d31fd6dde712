"""Tiny local task files for the evaluation tests."""

from __future__ import annotations

import json
from pathlib import Path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ARC_ROWS = [
    {"id": f"q{i}", "question": q, "answerKey": key,
     "choices": {"label": ["A", "B", "C"], "text": choices}}
    for i, (q, choices, key) in enumerate([
        ("What is the capital of France?", ["Paris", "a dog", "the roof"], "A"),
        ("Which tool cuts wood?", ["a hammer", "a saw", "light"], "B"),
        ("What do plants turn light into?", ["nails", "foxes", "chemical energy"], "C"),
        ("Which animal is quick and brown?", ["the fox", "the algae", "Paris"], "A"),
        ("Where is the man sitting?", ["on a roof", "in France", "on a saw"], "A"),
        ("What does add return?", ["a + b", "wood", "the dog"], "A"),
    ])
]
