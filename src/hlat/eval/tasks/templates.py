"""lm-evaluation-harness's doc_to_text / doc_to_target / doc_to_choice semantics: a value is a field
name of the example, a Jinja template rendered with the example's fields, or a literal.

A task file is input from anywhere, and a plain Jinja environment runs Python for it
(`{{ lipsum.__globals__['os'].system(...) }}`). Templates render in Jinja's immutable sandbox,
which refuses attributes that reach interpreter internals (underscored names, function globals,
frames) and methods that mutate; underscored names are also refused when the file is read, so
the usual attack fails before any model loads. What a render may build and do is bounded
(template_bounds.py): every filter, method call, operator, `~`, loop and output is checked, so a
template cannot exhaust memory or time.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from hlat.errors import UserError
from hlat.eval.tasks import template_bounds as bounds
from hlat.eval.tasks.base import Doc

MAX_REPEAT = 1_000_000  # items or characters one `*` may produce
MAX_EXPONENT = 64
MAX_LITERAL = 100_000  # characters of a rendered list literal (choices, answers)
# what a template may get wrong about its data: a message naming the file and field, not a traceback
RENDER_ERRORS = (TypeError, ValueError, ArithmeticError, LookupError, RecursionError, jinja2.TemplateError)


class TemplateError(UserError, ValueError):
    """A template that names a field the example lacks, or reaches past the example's fields."""


def _regex_replace(text: str, pattern: str, repl: str, count: int = 0) -> str:
    return re.sub(pattern, repl, text, count=count)


class _BoundedCode(CodeGenerator):
    """`a ~ b` through the environment's checked concat instead of an unchecked str join."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _TaskTemplates(ImmutableSandboxedEnvironment):
    """lm-eval's environment (a missing field is an error, a trailing newline is kept, the
    regex_replace filter), sandboxed, with every operator, call, filter and output bounded."""

    code_generator_class = _BoundedCode
    intercepted_binops = frozenset({"*", "**", "+", "%"})
    concat = staticmethod(bounds.concat)  # type: ignore[assignment]

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int) and abs(right) > MAX_EXPONENT:
            raise SecurityError(f"an exponent above {MAX_EXPONENT} ({right})")
        ints = isinstance(left, int) and isinstance(right, int)
        if operator == "**" and ints and left.bit_length() * abs(right) > bounds.MAX_INT_BITS:
            raise SecurityError(f"a power of more than {bounds.MAX_INT_BITS:,} bits")
        if operator == "*":
            if ints and left.bit_length() + right.bit_length() > bounds.MAX_INT_BITS:
                raise SecurityError(f"a product of more than {bounds.MAX_INT_BITS:,} bits")
            for count, seq in ((left, right), (right, left)):
                if isinstance(count, int) and isinstance(seq, (str, list, tuple)) and count * len(seq) > MAX_REPEAT:
                    raise SecurityError(f"a repetition of more than {MAX_REPEAT:,} items")
                if isinstance(count, int) and isinstance(seq, (list, tuple)):
                    bounds.expect(count * bounds.size(seq), "a repetition")
        if operator == "%" and isinstance(left, str):
            bounds.printf(left, right)
        return bounds.check(super().call_binop(context, operator, left, right), f"the result of {operator}")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - as Jinja's
        bounds.spend(bounds.STEP_COST)
        args = bounds.method_args(__obj, args, kwargs)
        return bounds.check(super().call(__context, __obj, *args, **kwargs), "a call's result")

    def getitem(self, obj: Any, argument: Any) -> Any:
        value = super().getitem(obj, argument)
        return bounds.check(value, "a slice") if isinstance(argument, slice) else value

    def wrap_str_format(self, value: Any) -> Any:
        """str.format and format_map, with widths and the result's size checked."""
        if super().wrap_str_format(value) is None:
            return None
        text, is_map = value.__self__, value.__name__ == "format_map"

        def formatted(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                args, kwargs = (), args[0]
            return bounds.CountedFormatter(self).vformat(text, args, kwargs)

        return formatted


def _for_steps(tree: nodes.Template) -> nodes.Template:
    """Each for loop iterates through bounds.steps, which charges every iteration."""
    for loop in tree.find_all(nodes.For):
        loop.iter = nodes.Filter(loop.iter, STEPS_FILTER, [], [], None, None, lineno=loop.iter.lineno)
    return tree


STEPS_FILTER = "hlat_steps"
_ENV = _TaskTemplates(
    loader=jinja2.BaseLoader(),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    finalize=lambda value: bounds.check(value, "an output"),
)
_ENV.filters["regex_replace"] = _regex_replace
_ENV.filters = bounds.bounded_filters(_ENV.filters)
_ENV.filters[STEPS_FILTER] = bounds.steps
_ENV.globals["lipsum"] = bounds.lipsum


def _internal_names(tree: nodes.Template) -> list[str]:
    """Underscored attribute and item names: no example field is read that way, every known
    sandbox escape starts that way."""
    names = [node.attr for node in tree.find_all(nodes.Getattr)]
    names += [node.arg.value for node in tree.find_all(nodes.Getitem) if isinstance(node.arg, nodes.Const)]
    return [name for name in names if isinstance(name, str) and name.startswith("_")]


def _shown(template: str) -> str:
    return repr(template) if len(template) <= 120 else repr(template[:100]) + f"... ({len(template):,} characters)"


def render(template: str, where: str = "template") -> Callable[[Doc], str]:
    """The template's fill function; `where` (e.g. "task.yaml: doc_to_text") starts every error."""
    shown = _shown(template)
    tree = _ENV.parse(template)
    internal = _internal_names(tree)
    if internal:
        raise TemplateError(
            f"{where}: template {shown} reads {', '.join(sorted(set(internal)))}: a template may read "
            "the example's fields only (docs/evaluation.md)"
        )
    compiled = _ENV.from_string(_for_steps(tree))

    def fill(doc: Doc) -> str:
        bounds.start()
        try:
            return compiled.render(**doc)
        except jinja2.UndefinedError as err:
            raise TemplateError(
                f"{where}: template {shown}: {err.message}; the example's fields are {', '.join(doc)}"
            ) from err
        except (SecurityError, OverflowError) as err:  # OverflowError: the sandbox's cap on range()
            raise TemplateError(
                f"{where}: template {shown} was refused: {err} (a template may read the example's "
                "fields only: docs/evaluation.md)"
            ) from err
        except bounds.TemplateLimitError as err:
            raise TemplateError(
                f"{where}: template {shown} was stopped: {err} (the limits: docs/evaluation.md)"
            ) from err
        except RENDER_ERRORS as err:
            raise TemplateError(f"{where}: template {shown} failed: {type(err).__name__}: {err}") from err
        except MemoryError as err:  # an operation nothing above bounds; the message, not a traceback
            raise TemplateError(f"{where}: template {shown} ran out of memory") from err

    return fill


def _literal(text: str, where: str, template: str) -> Any:
    """A rendered Python literal (a list of choices or answers)."""
    if len(text) > MAX_LITERAL:
        raise TemplateError(
            f"{where}: template {_shown(template)} renders {len(text):,} characters, over the "
            f"{MAX_LITERAL:,} of a list literal"
        )
    try:
        return ast.literal_eval(text)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as err:
        raise TemplateError(
            f"{where}: template {_shown(template)} rendered {text[:80]!r}, not a Python literal ({err})"
        ) from err


def to_text(spec: str, where: str = "doc_to_text") -> Callable[[Doc], str]:
    rendered = render(spec, where)
    return lambda doc: str(doc[spec]) if spec in doc else rendered(doc)


def to_target(spec: Any, has_choices: bool, where: str = "doc_to_target") -> Callable[[Doc], Any]:
    """A field's value, else the rendered template: an index when the task has choices and it is
    all digits, a list when it reads as a Python list, else the text."""
    if not isinstance(spec, str):  # an int index or a list of answers
        return lambda doc: spec
    rendered = render(spec, where)

    def target(doc: Doc) -> Any:
        if spec in doc:
            return doc[spec]
        text = rendered(doc)
        if text.isdigit() and has_choices:
            return int(text)
        if len(text) >= 2 and text[0] == "[" and text[-1] == "]":
            try:
                return _literal(text, where, spec)
            except TemplateError:
                return text
        return text

    return target


def to_choices(spec: Any, where: str = "doc_to_choice") -> Callable[[Doc], list[str]]:
    """A literal list (or a dict's values), a field holding a list, or a template that renders
    to a Python list literal."""
    if isinstance(spec, list):
        return lambda doc: list(spec)
    if isinstance(spec, dict):
        return lambda doc: list(spec.values())
    rendered = render(spec, where)

    def choices(doc: Doc) -> list[str]:
        value = doc[spec] if spec in doc else _literal(rendered(doc), where, spec)
        if not isinstance(value, (list, tuple)):
            raise TemplateError(f"{where}: {_shown(spec)} gave {str(value)[:80]!r}, not a list of choices")
        return list(value)

    return choices
