"""Rolling log-likelihood over a text set: perplexity and bits per byte."""

from __future__ import annotations

from hlat.eval.tasks.base import Dataset, Task

TASKS = [
    Task(
        "perplexity",
        "language modelling",
        "perplexity",
        Dataset("perplexity", "test"),
        doc_to_text=lambda d: d["text"],
        metrics=("word_perplexity", "byte_perplexity", "bits_per_byte"),
        notes='any text set: <data-dir>/perplexity/test.jsonl with a "text" field per document',
    ),
]
