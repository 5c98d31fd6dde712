"""What a task is: where its examples come from, how an example becomes a prompt, how it is scored.

Fields mirror lm-evaluation-harness's task YAML (doc_to_text, doc_to_choice, doc_to_target,
target_delimiter, fewshot_delimiter, description, generation `until`), so each definition can be
checked line by line against lm-eval's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from hlat.eval.sandbox import Program

Doc = dict[str, Any]
Kind = Literal["multiple_choice", "loglikelihood", "generate", "code", "perplexity"]


@dataclass(frozen=True)
class Dataset:
    """Local files `<data-dir>/<local>/<split>.{jsonl,json,parquet,arrow}` (or one folder per
    entry of `hub_configs`), else the Hugging Face hub (`hub`, `hub_name`), else `bundled`. A task
    file may instead name its files: `files` (split -> files) or a folder `path` of <split>.<ext>."""

    local: str
    split: str
    hub: str = ""
    hub_name: str | None = None
    hub_configs: tuple[str, ...] = ()  # loaded one by one, each doc tagged with "config"
    fewshot_split: str | None = None  # None: the evaluation split, minus the example itself
    bundled: Callable[[str], list[Doc]] | None = None  # split -> docs shipped by a package
    files: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (split, its files)
    path: str = ""  # a folder holding <split>.{jsonl,json,parquet,arrow}


@dataclass(frozen=True)
class Task:
    name: str
    category: str  # the paper's group: knowledge, reasoning, commonsense, world knowledge, math, code
    kind: Kind
    data: Dataset
    doc_to_text: Callable[[Doc], str]
    # multiple_choice: the gold index; generate: the accepted answers; loglikelihood: the
    # continuation; code: unused (see program)
    doc_to_target: Callable[[Doc], Any] = lambda doc: None
    doc_to_choice: Callable[[Doc], list[str]] | None = None
    metrics: tuple[str, ...] = ("acc",)
    num_fewshot: int = 0
    fewshot_order: Literal["random", "first"] = "random"  # lm-eval's default vs first_n sampler
    fewshot_target: Callable[[Doc], str] | None = None  # answer text of a few-shot example
    group_key: str | None = None  # few-shot examples share this field's value (MMLU subject)
    description: Callable[[Doc], str] | None = None  # text before the few-shot examples
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"
    # winogrande: the choices are alternative contexts for one shared continuation
    multiple_input: bool = False
    process_docs: Callable[[list[Doc]], list[Doc]] | None = None
    until: tuple[str, ...] = ()
    max_tokens: int = 256
    # generate: metric name -> how to find the answer inside a generation (lm-eval's filters)
    extractors: dict[str, Callable[[str], str]] | None = None
    ignore: tuple[str, ...] = ()  # regexes removed before exact match
    ignore_punctuation: bool = True
    ignore_case: bool = True
    fewshot_docs: Callable[[list[Doc]], list[Doc]] | None = None  # narrows the few-shot pool
    program: Callable[[Doc, str], Program] | None = None  # code: (doc, completion) -> solution + test
    notes: str = ""  # deviations from lm-eval, for docs/evaluation.md

    def gold_text(self, doc: Doc) -> str:
        """The answer a few-shot example shows after its question."""
        if self.fewshot_target is not None:
            return self.fewshot_target(doc)
        if self.multiple_input:
            return self.doc_to_text(doc)
        if self.doc_to_choice is not None:
            return self.doc_to_choice(doc)[self.doc_to_target(doc)]
        target = self.doc_to_target(doc)
        return target[0] if isinstance(target, (list, tuple)) else str(target)

    def example_text(self, doc: Doc) -> str:
        if self.multiple_input:  # winogrande: the gold context then the shared continuation
            return self.doc_to_choice(doc)[self.doc_to_target(doc)]
        return self.doc_to_text(doc)

    def prompt(self, doc: Doc, shots: Sequence[Doc]) -> str:
        """description + shots (each "question<delim>answer") + the question, as lm-eval builds it.
        For multiple_input tasks this is the prefix each choice is appended to."""
        text = self.description(doc) if self.description else ""
        if shots:
            text += self.fewshot_delimiter.join(
                self.example_text(s) + self.target_delimiter + self.gold_text(s) for s in shots
            )
            text += self.fewshot_delimiter
        return text if self.multiple_input else text + self.doc_to_text(doc)


def choose_shots(
    task: Task, index: int, doc: Doc, pool: Sequence[Doc], k: int, seed: int, same_split: bool
) -> list[Doc]:
    """k few-shot examples for example `index`, a pure function of (seed, task, index): the prompt of
    an example does not depend on which other examples are evaluated or in what order."""
    if k <= 0:
        return []
    if task.group_key is not None:
        pool = [d for d in pool if d.get(task.group_key) == doc.get(task.group_key)]
    if same_split:  # never show the example its own answer
        pool = [d for d in pool if d is not doc]
    if len(pool) < k:
        raise ValueError(
            f"task {task.name}: {k} few-shot examples requested but only {len(pool)} are available; lower --num-fewshot"
        )
    if task.fewshot_order == "first":
        return list(pool[:k])
    return random.Random(f"{seed}/{task.name}/{index}").sample(list(pool), k)
