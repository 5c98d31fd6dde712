"""Log-likelihood multiple-choice tasks: MMLU and the paper's commonsense-reasoning set.
Prompts, choices and targets are lm-evaluation-harness 0.4's (task YAML named in each comment)."""

from __future__ import annotations

import re

from hlat.eval.tasks.base import Dataset, Doc, Task

MC = ("acc", "acc_norm")


def _arc(name: str, config: str) -> Task:  # arc/arc_easy.yaml, arc/arc_challenge.yaml
    return Task(
        name,
        "commonsense",
        "multiple_choice",
        Dataset(name, "test", "allenai/ai2_arc", config),
        doc_to_text=lambda d: f"Question: {d['question']}\nAnswer:",
        doc_to_choice=lambda d: list(d["choices"]["text"]),
        doc_to_target=lambda d: list(d["choices"]["label"]).index(d["answerKey"]),
        metrics=MC,
    )


def _hellaswag_clean(text: str) -> str:  # hellaswag/utils.py: WikiHow bracket artifacts
    text = text.strip().replace(" [title]", ". ")
    return re.sub("\\[.*?\\]", "", text).replace("  ", " ")


def _hellaswag_docs(docs: list[Doc]) -> list[Doc]:
    out = []
    for d in docs:
        ctx = d["ctx_a"] + " " + d["ctx_b"].capitalize()
        out.append(
            {
                **d,
                "query": _hellaswag_clean(d["activity_label"] + ": " + ctx),
                "choices": [_hellaswag_clean(e) for e in d["endings"]],
                "gold": int(d["label"]),
            }
        )
    return out


def _winogrande_choices(d: Doc) -> list[str]:  # winogrande/preprocess_winogrande.py
    cut = d["sentence"].index("_")
    return [d["sentence"][:cut] + d["option1"], d["sentence"][:cut] + d["option2"]]


def _mmlu_text(d: Doc) -> str:
    c = d["choices"]
    return f"{d['question'].strip()}\nA. {c[0]}\nB. {c[1]}\nC. {c[2]}\nD. {c[3]}\nAnswer:"


TASKS = [
    _arc("arc_easy", "ARC-Easy"),
    _arc("arc_challenge", "ARC-Challenge"),
    Task(  # super_glue/boolq/default.yaml
        "boolq",
        "commonsense",
        "multiple_choice",
        Dataset("boolq", "validation", "aps/super_glue", "boolq"),
        doc_to_text=lambda d: f"{d['passage']}\nQuestion: {d['question']}?\nAnswer:",
        doc_to_choice=lambda d: ["no", "yes"],
        doc_to_target=lambda d: int(d["label"]),
    ),
    Task(  # hellaswag/hellaswag.yaml
        "hellaswag",
        "commonsense",
        "multiple_choice",
        Dataset("hellaswag", "validation", "Rowan/hellaswag"),
        doc_to_text=lambda d: d["query"],
        doc_to_choice=lambda d: d["choices"],
        doc_to_target=lambda d: d["gold"],
        metrics=MC,
        process_docs=_hellaswag_docs,
    ),
    Task(  # openbookqa/openbookqa.yaml
        "openbookqa",
        "commonsense",
        "multiple_choice",
        Dataset("openbookqa", "test", "allenai/openbookqa", "main"),
        doc_to_text=lambda d: d["question_stem"],
        doc_to_choice=lambda d: list(d["choices"]["text"]),
        doc_to_target=lambda d: list(d["choices"]["label"]).index(d["answerKey"].lstrip()),
        metrics=MC,
    ),
    Task(  # piqa/piqa.yaml
        "piqa",
        "commonsense",
        "multiple_choice",
        Dataset("piqa", "validation", "baber/piqa"),
        doc_to_text=lambda d: f"Question: {d['goal']}\nAnswer:",
        doc_to_choice=lambda d: [d["sol1"], d["sol2"]],
        doc_to_target=lambda d: int(d["label"]),
        metrics=MC,
    ),
    Task(  # siqa/siqa.yaml (lm-eval names it social_iqa)
        "siqa",
        "commonsense",
        "multiple_choice",
        Dataset("siqa", "validation", "lighteval/siqa"),
        doc_to_text=lambda d: f"Q: {d['context']} {d['question']}\nA:",
        doc_to_choice=lambda d: [d["answerA"], d["answerB"], d["answerC"]],
        doc_to_target=lambda d: int(d["label"]) - 1,
    ),
    Task(  # winogrande/default.yaml: "partial evaluation", one continuation after two contexts
        "winogrande",
        "commonsense",
        "multiple_choice",
        Dataset("winogrande", "validation", "allenai/winogrande", "winogrande_xl"),
        doc_to_text=lambda d: d["sentence"][d["sentence"].index("_") + 1 :].strip(),
        doc_to_choice=_winogrande_choices,
        doc_to_target=lambda d: {"1": 0, "2": 1}[str(d["answer"])],
        multiple_input=True,
    ),
    Task(  # mmlu/default/_default_template_yaml: 57 subjects in one task, 5-shot from dev
        "mmlu",
        "knowledge",
        "multiple_choice",
        Dataset("mmlu", "test", "cais/mmlu", "all", fewshot_split="dev"),
        doc_to_text=_mmlu_text,
        doc_to_choice=lambda d: ["A", "B", "C", "D"],
        doc_to_target=lambda d: int(d["answer"]),
        num_fewshot=5,
        fewshot_order="first",
        group_key="subject",
        description=lambda d: (
            f"The following are multiple choice questions (with answers) about {d['subject'].replace('_', ' ')}.\n\n"
        ),
        notes="one task over all 57 subjects: acc is the mean over questions, which equals lm-eval's "
        "group score (weight_by_size)",
    ),
]
