"""lm-evaluation-harness's doc_to_text / doc_to_target / doc_to_choice semantics: a value is a field
name of the example, a Jinja template rendered with the example's fields, or a literal.

A task file is input from anywhere, and a plain Jinja environment runs Python for it
(`{{ lipsum.__globals__['os'].system(...) }}`). Templates render in Jinja's immutable sandbox,
which refuses attributes that reach interpreter internals (underscored names, function globals,
frames) and methods that mutate; underscored names are also refused when the file is read, so
the usual attack fails before any model loads. The sandbox also caps range(); repetition (`*`)
and powers (`**`) are capped here, so a template cannot exhaust memory (nested loops can still
take long).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from hlat.errors import UserError
from hlat.eval.tasks.base import Doc

MAX_REPEAT = 1_000_000  # items or characters one `*` may produce
MAX_EXPONENT = 64


class TemplateError(UserError, ValueError):
    """A template that names a field the example lacks, or reaches past the example's fields."""


def _regex_replace(text: str, pattern: str, repl: str, count: int = 0) -> str:
    return re.sub(pattern, repl, text, count=count)


class _TaskTemplates(ImmutableSandboxedEnvironment):
    """lm-eval's environment (a missing field is an error, a trailing newline is kept, the
    regex_replace filter), sandboxed, with `*` and `**` bounded."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int) and abs(right) > MAX_EXPONENT:
            raise SecurityError(f"an exponent above {MAX_EXPONENT} ({right})")
        if operator == "*":
            for count, seq in ((left, right), (right, left)):
                if isinstance(count, int) and isinstance(seq, (str, list, tuple)) and count * len(seq) > MAX_REPEAT:
                    raise SecurityError(f"a repetition of more than {MAX_REPEAT:,} items")
        return super().call_binop(context, operator, left, right)


_ENV = _TaskTemplates(loader=jinja2.BaseLoader(), undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
_ENV.filters["regex_replace"] = _regex_replace


def _internal_names(template: str) -> list[str]:
    """Underscored attribute and item names: no example field is read that way, every known
    sandbox escape starts that way."""
    tree = _ENV.parse(template)
    names = [node.attr for node in tree.find_all(nodes.Getattr)]
    names += [node.arg.value for node in tree.find_all(nodes.Getitem) if isinstance(node.arg, nodes.Const)]
    return [name for name in names if isinstance(name, str) and name.startswith("_")]


def render(template: str) -> Callable[[Doc], str]:
    internal = _internal_names(template)
    if internal:
        raise TemplateError(
            f"template {template!r} reads {', '.join(sorted(set(internal)))}: a template may read "
            "the example's fields only (docs/evaluation.md)"
        )
    compiled = _ENV.from_string(template)

    def fill(doc: Doc) -> str:
        try:
            return compiled.render(**doc)
        except jinja2.UndefinedError as err:
            raise TemplateError(
                f"template {template!r}: {err.message}; the example's fields are {', '.join(doc)}"
            ) from err
        except (SecurityError, OverflowError) as err:  # OverflowError: the sandbox's cap on range()
            raise TemplateError(
                f"template {template!r} was refused: {err} (a template may read the example's "
                "fields only: docs/evaluation.md)"
            ) from err

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
