"""Per-example scores and their aggregation, as lm-evaluation-harness computes them."""

from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence

import numpy as np


def mean_stderr(values: Sequence[float]) -> float:
    """Standard error of the mean (sample standard deviation / sqrt(n)); 0 for n < 2."""
    if len(values) < 2:
        return 0.0
    return float(np.std(values, ddof=1) / math.sqrt(len(values)))


def multiple_choice(lls: Sequence[float], choices: Sequence[str], gold: int) -> dict[str, float]:
    """acc: the most likely choice is gold. acc_norm: the same after dividing each log-likelihood by
    its choice's length in characters (lm-eval's definition; the delimiter is not counted)."""
    scores = np.asarray(lls, dtype=np.float64)
    lengths = np.asarray([float(len(c)) for c in choices])
    return {"acc": float(np.argmax(scores) == gold), "acc_norm": float(np.argmax(scores / lengths) == gold)}


def normalize_answer(
    text: str, ignore: Sequence[str] = (), ignore_punctuation: bool = True, ignore_case: bool = True
) -> str:
    """lm-eval's exact_match: strip the `ignore` regexes, optionally lower-case and drop ASCII
    punctuation, then trim surrounding whitespace (lm-eval's remove_whitespace filter drops one
    leading space; trimming also forgives trailing spaces)."""
    for pattern in ignore:
        text = re.sub(pattern, "", text)
    if ignore_case:
        text = text.lower()
    if ignore_punctuation:
        text = text.translate(str.maketrans("", "", string.punctuation))
    return text.strip()


def exact_match(
    prediction: str,
    targets: Sequence[str],
    ignore: Sequence[str] = (),
    ignore_punctuation: bool = True,
    ignore_case: bool = True,
) -> float:
    pred = normalize_answer(prediction, ignore, ignore_punctuation, ignore_case)
    return float(any(pred == normalize_answer(t, ignore, ignore_punctuation, ignore_case) for t in targets))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c pass (Chen et al. 2021, the Codex paper)."""
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def loglikelihood_perplexity(lls: Sequence[float]) -> float:
    """lm-eval's `perplexity` of a loglikelihood task: exp(-mean log-likelihood per example)."""
    return math.exp(-sum(lls) / max(len(lls), 1))


def perplexity_metrics(lls: Sequence[float], words: Sequence[int], nbytes: Sequence[int]) -> dict[str, float]:
    """Corpus-level word/byte perplexity and bits per byte: total log-likelihood over total units,
    as lm-eval's weighted_perplexity and bits_per_byte aggregations."""
    total = float(sum(lls))
    return {
        "word_perplexity": math.exp(-total / max(sum(words), 1)),
        "byte_perplexity": math.exp(-total / max(sum(nbytes), 1)),
        "bits_per_byte": -total / max(sum(nbytes), 1) / math.log(2),
    }
