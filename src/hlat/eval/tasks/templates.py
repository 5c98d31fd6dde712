"""lm-evaluation-harness's doc_to_text / doc_to_target / doc_to_choice semantics: a value is a field
name of the example, a Jinja template rendered with the example's fields, or a literal."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import Any

import jinja2

from hlat.eval.tasks.base import Doc


def _regex_replace(text: str, pattern: str, repl: str, count: int = 0) -> str:
    return re.sub(pattern, repl, text, count=count)


# lm-eval's environment: a missing field is an error, a trailing newline is kept
_ENV = jinja2.Environment(loader=jinja2.BaseLoader(), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True)
_ENV.filters["regex_replace"] = _regex_replace


def render(template: str) -> Callable[[Doc], str]:
    compiled = _ENV.from_string(template)

    def fill(doc: Doc) -> str:
        try:
            return compiled.render(**doc)
        except jinja2.UndefinedError as err:
            raise ValueError(f"template {template!r}: {err.message}; the example's fields are "
                             f"{', '.join(doc)}") from err
    return fill


def to_text(spec: str) -> Callable[[Doc], str]:
    rendered = render(spec)
    return lambda doc: str(doc[spec]) if spec in doc else rendered(doc)


def to_target(spec: Any, has_choices: bool) -> Callable[[Doc], Any]:
    """A field's value, else the rendered template: an index when the task has choices and it is
    all digits, a list when it reads as a Python list, else the text."""
    if not isinstance(spec, str):  # an int index or a list of answers
        return lambda doc: spec
    rendered = render(spec)

    def target(doc: Doc) -> Any:
        if spec in doc:
            return doc[spec]
        text = rendered(doc)
        if text.isdigit() and has_choices:
            return int(text)
        if len(text) >= 2 and text[0] == "[" and text[-1] == "]":
            try:
                return ast.literal_eval(text)
            except (SyntaxError, ValueError):
                return text
        return text
    return target


def to_choices(spec: Any) -> Callable[[Doc], list[str]]:
    """A literal list (or a dict's values), a field holding a list, or a template that renders
    to a Python list literal."""
    if isinstance(spec, list):
        return lambda doc: list(spec)
    if isinstance(spec, dict):
        return lambda doc: list(spec.values())
    rendered = render(spec)
    return lambda doc: list(doc[spec]) if spec in doc else list(ast.literal_eval(rendered(doc)))
