"""What a section's fields accept and mean, read from the section's class: the allowed values of a
choice are its `Literal[...]` annotation, and a field's description is the docstring under it in
the class body. Validation, `hlat config --explain` and docs/configuration.md all read these, so
the values and the words cannot drift apart."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import textwrap
import typing
from functools import cache
from typing import Any


@cache
def field_types(cls: type) -> dict[str, Any]:
    """The section's annotations, evaluated (the modules use postponed annotations)."""
    return typing.get_type_hints(cls)


def choices(cls: type, name: str) -> tuple[str, ...]:
    """The values a Literal-annotated field accepts, in their declared order; () for other fields."""
    hint = field_types(cls)[name]
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else ()


def choice_problems(section: Any, *names: str) -> list[tuple[str, str]]:
    """(field, "got 'x'; choose one of a, b, c") for each named choice the section's value is not."""
    return [
        (name, f"got {getattr(section, name)!r}; choose one of {', '.join(choices(type(section), name))}")
        for name in names
        if getattr(section, name) not in choices(type(section), name)
    ]


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's description: the string literal right after its annotated assignment in the
    class body (an attribute docstring), with its line breaks folded."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def value_problem(value: Any) -> str | None:
    """Why no field can hold the value, or None: a float that is NaN or infinite (no setting means
    anything by it: "no limit" is 0 where a field has one), or text that is not Unicode (a lone
    surrogate, as a non-UTF-8 file name decodes to), which config.toml could not hold."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    for text in value if isinstance(value, list) else [value]:
        if isinstance(text, str):
            bad = next((c for c in text if 0xD800 <= ord(c) <= 0xDFFF), None)
            if bad is not None:
                return (
                    f"{text!r} is not valid Unicode (U+{ord(bad):04X}, e.g. a file name that is not "
                    "UTF-8): config.toml holds UTF-8 text only; rename it"
                )
    return None


def value_problems(section: Any) -> list[tuple[str, str]]:
    """(field, problem) for each of the section's values that value_problem refuses."""
    found = ((f.name, value_problem(getattr(section, f.name))) for f in dataclasses.fields(section))
    return [(name, problem) for name, problem in found if problem]
