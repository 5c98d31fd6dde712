"""Greedy-generation tasks scored by exact match: world knowledge, math and BIG-Bench Hard.
Prompts, stop sequences and answer extraction are lm-evaluation-harness 0.4's unless noted."""

from __future__ import annotations

import re

from hlat.eval.tasks.base import Dataset, Task

ARTICLES = (r"\b(?:The |the |An |A |The |a |an )",)  # nq_open.yaml regexes_to_ignore
SHORT_ANSWER_STOPS = ("\n", ".", ",")

BBH_SUBTASKS = (
    "boolean_expressions",
    "causal_judgement",
    "date_understanding",
    "disambiguation_qa",
    "dyck_languages",
    "formal_fallacies",
    "geometric_shapes",
    "hyperbaton",
    "logical_deduction_five_objects",
    "logical_deduction_seven_objects",
    "logical_deduction_three_objects",
    "movie_recommendation",
    "multistep_arithmetic_two",
    "navigate",
    "object_counting",
    "penguins_in_a_table",
    "reasoning_about_colored_objects",
    "ruin_names",
    "salient_translation_error_detection",
    "snarks",
    "sports_understanding",
    "temporal_sequences",
    "tracking_shuffled_objects_five_objects",
    "tracking_shuffled_objects_seven_objects",
    "tracking_shuffled_objects_three_objects",
    "web_of_lies",
    "word_sorting",
)


def _strip(text: str) -> str:
    return text.strip()


def gsm8k_strict(text: str) -> str:
    """The number after "#### " (the format the few-shot answers teach), else "[invalid]"."""
    m = re.search(r"#### (\-?[0-9\.\,]+)", text)
    return m.group(1) if m else "[invalid]"


def gsm8k_flexible(text: str) -> str:
    """The last number in the generation (lm-eval's flexible-extract)."""
    found = re.findall(r"(-?[$0-9.,]{2,})|(-?[0-9]+)", text)
    if not found:
        return "[invalid]"
    return next(g for g in found[-1] if g)


TASKS = [
    Task(  # nq_open/nq_open.yaml
        "nq_open",
        "world knowledge",
        "generate",
        Dataset("nq_open", "validation", "google-research-datasets/nq_open", fewshot_split="train"),
        doc_to_text=lambda d: f"Q: {d['question']}?\nA:",
        doc_to_target=lambda d: list(d["answer"]),
        metrics=("exact_match",),
        num_fewshot=5,
        description=lambda d: "Answer these questions:\n\n",
        fewshot_delimiter="\n",
        until=SHORT_ANSWER_STOPS,
        extractors={"exact_match": _strip},
        ignore=ARTICLES,
        notes="5-shot (lm-eval's default is 0; the paper reports few-shot)",
    ),
    Task(  # triviaqa/default.yaml
        "triviaqa",
        "world knowledge",
        "generate",
        Dataset("triviaqa", "validation", "mandarjoshi/trivia_qa", "rc.nocontext", fewshot_split="train"),
        doc_to_text=lambda d: f"Question: {d['question']}?\nAnswer:",
        doc_to_target=lambda d: list(d["answer"]["aliases"]),
        metrics=("exact_match",),
        num_fewshot=5,
        until=SHORT_ANSWER_STOPS,
        extractors={"exact_match": _strip},
        notes="5-shot (lm-eval's default is 0; the paper reports few-shot)",
    ),
    Task(  # gsm8k/gsm8k.yaml
        "gsm8k",
        "math",
        "generate",
        Dataset("gsm8k", "test", "openai/gsm8k", "main", fewshot_split="train"),
        doc_to_text=lambda d: f"Question: {d['question']}\nAnswer:",
        doc_to_target=lambda d: [d["answer"]],
        metrics=("exact_match", "exact_match_flexible"),
        num_fewshot=8,
        until=("Question:", "</s>", "<|im_end|>"),
        extractors={"exact_match": gsm8k_strict, "exact_match_flexible": gsm8k_flexible},
        ignore=(",", r"\$", r"(?s).*#### ", r"\.$"),
        ignore_punctuation=False,
        notes="8-shot as in the paper (lm-eval's default is 5); shots drawn from train",
    ),
    Task(  # bbh/fewshot/_fewshot_template_yaml
        "bbh",
        "reasoning",
        "generate",
        Dataset("bbh", "test", "SaylorTwift/bbh", hub_configs=BBH_SUBTASKS),
        doc_to_text=lambda d: f"Q: {d['input']}\nA:",
        doc_to_target=lambda d: [d["target"]],
        metrics=("exact_match",),
        num_fewshot=3,
        fewshot_order="first",
        group_key="config",
        until=("</s>", "Q", "\n\n"),
        extractors={"exact_match": _strip},
        ignore_punctuation=False,
        notes="all 27 subtasks in one task (acc = mean over questions); shots are the first 3 "
        "other questions of the same subtask, not lm-eval's fixed prompt examples, and no "
        "per-subtask description; the answer is compared after trimming whitespace",
    ),
]
