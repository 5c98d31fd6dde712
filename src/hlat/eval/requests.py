"""The three things a task can ask of a language model, as lm-evaluation-harness defines them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoglikelihoodRequest:
    """log P(continuation | context), summed over the continuation's tokens. `continuation` carries
    its own leading delimiter (" Paris"), exactly as the prompt would continue."""

    context: str
    continuation: str


@dataclass(frozen=True)
class RollingRequest:
    """log P(text) over the whole text, scored in disjoint windows of the model's length."""

    text: str


@dataclass(frozen=True)
class GenerateRequest:
    """Continue `context` until a stop sequence, EOS or `max_tokens`; greedy when temperature is 0,
    else sampled from the smallest set of tokens whose probability reaches `top_p` (nucleus).
    The result excludes the context and is cut before the first stop sequence."""

    context: str
    until: tuple[str, ...] = ()
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
