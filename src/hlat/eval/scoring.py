"""Turning a task's prompts into requests, running them, and scoring each example.

Every scorer sends all of a task's requests to the model at once, so the model can sort them by
length and batch across examples. Each returns one dict of metric values per example and one
sample record per example (prompt, what the model produced, the per-choice log-likelihoods).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hlat.eval.lm import LanguageModel
from hlat.eval.metrics import exact_match, multiple_choice, pass_at_k
from hlat.eval.requests import GenerateRequest, LoglikelihoodRequest, RollingRequest
from hlat.eval.sandbox import SandboxLimits, require_isolation, run_programs
from hlat.eval.tasks.base import Doc, Task

Scores = tuple[list[dict[str, float]], list[dict[str, Any]]]


def score_multiple_choice(lm: LanguageModel, task: Task, docs: Sequence[Doc], prompts: Sequence[str]) -> Scores:
    assert task.doc_to_choice is not None, f"task {task.name} has no doc_to_choice"
    requests: list[LoglikelihoodRequest] = []
    spans: list[tuple[int, int]] = []
    for doc, prompt in zip(docs, prompts):
        choices = task.doc_to_choice(doc)
        if task.multiple_input:  # the choices complete the context; the continuation is shared
            cont = task.target_delimiter + task.doc_to_text(doc)
            reqs = [LoglikelihoodRequest(prompt + c, cont) for c in choices]
        else:
            reqs = [LoglikelihoodRequest(prompt, task.target_delimiter + c) for c in choices]
        spans.append((len(requests), len(requests) + len(reqs)))
        requests += reqs
    results = lm.loglikelihood(requests)
    scores, samples = [], []
    for doc, prompt, (a, b) in zip(docs, prompts, spans):
        lls = [ll for ll, _ in results[a:b]]
        gold = task.doc_to_target(doc)
        values = multiple_choice(lls, task.doc_to_choice(doc), gold)
        scores.append({m: values[m] for m in task.metrics})
        samples.append({"prompt": prompt, "gold": gold, "loglikelihoods": lls, **values})
    return scores, samples


def score_loglikelihood(lm: LanguageModel, task: Task, docs: Sequence[Doc], prompts: Sequence[str]) -> Scores:
    """One continuation per example (lm-eval's loglikelihood output type: doc_to_target, with no
    delimiter added). `perplexity` carries the log-likelihood; the harness aggregates it."""
    targets = [str(task.doc_to_target(doc)) for doc in docs]
    results = lm.loglikelihood([LoglikelihoodRequest(p, t) for p, t in zip(prompts, targets)])
    scores, samples = [], []
    for prompt, target, (ll, greedy) in zip(prompts, targets, results):
        values = {"perplexity": ll, "acc": float(greedy)}
        scores.append({m: values[m] for m in task.metrics})
        samples.append({"prompt": prompt, "target": target, "loglikelihood": ll, "greedy": greedy})
    return scores, samples


def score_generation(lm: LanguageModel, task: Task, docs: Sequence[Doc], prompts: Sequence[str]) -> Scores:
    outputs = lm.generate([GenerateRequest(p, task.until, task.max_tokens) for p in prompts])
    extractors = task.extractors or {m: str.strip for m in task.metrics}
    scores, samples = [], []
    for doc, prompt, output in zip(docs, prompts, outputs):
        targets = task.doc_to_target(doc)
        answers = {m: extractors[m](output) for m in task.metrics}
        scores.append(
            {
                m: exact_match(answers[m], targets, task.ignore, task.ignore_punctuation, task.ignore_case)
                for m in task.metrics
            }
        )
        samples.append({"prompt": prompt, "output": output, "answers": answers, "targets": targets, **scores[-1]})
    return scores, samples


def score_code(
    lm: LanguageModel,
    task: Task,
    docs: Sequence[Doc],
    prompts: Sequence[str],
    n_samples: int,
    temperature: float,
    limits: SandboxLimits,
    workers: int,
    allow_unsafe: bool = False,
) -> Scores:
    assert task.program is not None, f"task {task.name} has no program"
    require_isolation(allow_unsafe)  # refuse before generating, not after
    if n_samples > 1 and temperature <= 0:
        raise ValueError(
            f"{n_samples} samples per problem need --temperature > 0 (greedy "
            "decoding would produce the same completion every time)"
        )
    requests = [GenerateRequest(p, task.until, task.max_tokens, temperature) for p in prompts for _ in range(n_samples)]
    completions = lm.generate(requests)
    programs = [task.program(docs[i // n_samples], c) for i, c in enumerate(completions)]
    results = run_programs(programs, limits, workers, allow_unsafe)
    ks = [k for k in (1, 10, 100) if k <= n_samples]
    scores, samples = [], []
    for i, prompt in enumerate(prompts):
        mine = results[i * n_samples : (i + 1) * n_samples]
        passed = sum(r.passed for r in mine)
        scores.append({f"pass@{k}": pass_at_k(n_samples, passed, k) for k in ks})
        samples.append(
            {
                "prompt": prompt,
                "completions": completions[i * n_samples : (i + 1) * n_samples],
                "status": [r.status for r in mine],
                "errors": [r.detail[-300:] for r in mine],
                **scores[-1],
            }
        )
    return scores, samples


def score_perplexity(lm: LanguageModel, task: Task, docs: Sequence[Doc]) -> Scores:
    texts = [task.doc_to_text(d) for d in docs]
    lls = lm.loglikelihood_rolling([RollingRequest(t) for t in texts])
    rows = [
        {"loglikelihood": ll, "words": float(len(re.split(r"\s+", t))), "bytes": float(len(t.encode("utf-8")))}
        for ll, t in zip(lls, texts)
    ]
    return rows, [dict(r) for r in rows]
