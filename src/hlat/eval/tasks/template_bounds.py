"""What one task-file template render may build and do: bounded before anything is built.

Jinja's sandbox refuses unsafe attributes but lets a template ask for any amount of memory or
time: `'x'|center(10**10)`, `s|replace('', big)`, `[big] * n|join`, `'%*s' % (10**10, x)`,
`a ~ a` doubled in a loop, nested loops over range(). Every operation that can amplify its inputs
is checked against MAX_SIZE before it runs, every value built is checked after, and one render
may spend MAX_WORK units (characters built, STEP_COST per loop iteration or call) in all.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jinja2 import Undefined, pass_environment, pass_eval_context
from jinja2 import filters as jinja_filters
from jinja2.sandbox import SandboxedFormatter

MAX_SIZE = 8_000_000  # characters (or items) of any value a template builds, its output included
MAX_WORK = 32_000_000  # per render: characters built plus STEP_COST per loop iteration or call
STEP_COST = 320  # so a render runs at most 100,000 loop iterations and calls
MAX_SECONDS = 2.0  # per render, whatever each step costs
MAX_INT_BITS = 1 << 16
MAX_DEPTH = 100  # nesting of a value a template builds
# a printf conversion (`%-10.3f`, `%(name)s`, `%*d`): its width and precision
PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([a-zA-Z%])")


class TemplateLimitError(Exception):
    """A render that would build or do more than the limits allow."""


_render = threading.local()  # the work left to the render running in this thread


def start() -> None:
    _render.work, _render.deadline = MAX_WORK, time.monotonic() + MAX_SECONDS


def spend(units: int) -> None:
    left = getattr(_render, "work", MAX_WORK) - units
    if left < 0:
        raise TemplateLimitError(
            f"more than {MAX_WORK:,} units of work in one render "
            f"(characters built, {STEP_COST} per loop iteration or call)"
        )
    if time.monotonic() > getattr(_render, "deadline", float("inf")):
        raise TemplateLimitError(f"a render of more than {MAX_SECONDS:g} seconds")
    _render.work = left


def size(value: Any, limit: int = MAX_SIZE) -> int:
    """An upper bound, up to a constant, of len(str(value)), computed without building it and
    stopping once past `limit`; shared items count each time they appear, as str() writes them."""
    seen: dict[int, int] = {}

    def measure(item: Any, depth: int) -> int:
        if isinstance(item, str):
            return len(item)
        if isinstance(item, bool) or item is None or isinstance(item, Undefined):
            return 5
        if isinstance(item, int):
            return item.bit_length() // 3 + 1
        if isinstance(item, float):
            return 24
        if not isinstance(item, (list, tuple, set, frozenset, dict)):
            return len(str(item))  # a jinja helper (cycler, namespace, macro): small or made of checked values
        if id(item) in seen:
            return seen[id(item)]
        if depth > MAX_DEPTH:
            raise TemplateLimitError(f"a value nested deeper than {MAX_DEPTH}")
        total = len(item) + 2
        for part in item.items() if isinstance(item, dict) else item:
            total += measure(part, depth + 1)
            if total > limit:
                break
        seen[id(item)] = total
        return total

    return measure(value, 0)


def check(value: Any, what: str = "a value") -> Any:
    """`value` when it is within MAX_SIZE, charged to the render's work."""
    n = size(value)
    if n > MAX_SIZE:
        raise TemplateLimitError(f"{what} of more than {MAX_SIZE:,} characters")
    spend(n)
    return value


def width(n: Any, what: str) -> None:
    if isinstance(n, int) and n > MAX_SIZE:
        raise TemplateLimitError(f"{what} {n:,} is over {MAX_SIZE:,}")


def expect(total: int, what: str) -> None:
    """Refuse an operation whose result would hold `total` characters, before it is built."""
    if total > MAX_SIZE:
        raise TemplateLimitError(f"{what} would build more than {MAX_SIZE:,} characters")


def concat(pieces: Iterable[Any]) -> str:
    """Jinja's output, a macro's or block's, and `~`: each piece's size checked before str()
    builds it, the total as it grows."""
    parts, total = [], 0
    for piece in pieces:
        expect(total + size(piece, MAX_SIZE - total), "the output")
        text = str(piece)
        total += len(text)
        expect(total, "the output")
        spend(len(text))
        parts.append(text)
    return "".join(parts)


def steps(items: Iterable[Any]) -> Iterator[Any]:
    """A for loop's iterable, charging STEP_COST per iteration."""
    for item in items:
        spend(STEP_COST)
        yield item


def joined(items: Iterable[Any], separator: str) -> None:
    parts = list(items)
    total = len(separator) * max(0, len(parts) - 1)
    for part in parts:
        total += size(part)
        expect(total, "a join")


def replaced(text: str, old: str, new: str, count: Any = -1) -> None:
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    expect(len(text) + hits * max(0, len(new) - len(old)), "a replace")


def printf(template: str, args: Any) -> None:
    """`template % args`: each conversion's width and precision, and the result's size."""
    values = list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, tuple) else [args]
    longest = max((size(v) * 4 + 2 for v in values), default=0)  # %r may escape each character
    total = len(template)
    for match in PRINTF.finditer(template):
        for number in match.group(1, 2):
            if number == "*":
                raise TemplateLimitError("a '*' width or precision in a % format")
            if number:
                width(int(number), "a % format width")
                total += int(number)
        total += longest + 400  # a float's digits
    expect(total, "a % format")


class CountedFormatter(SandboxedFormatter):
    """str.format in the sandbox (attribute and item lookups checked), with each field's spec
    width checked and the result's size counted as it is built."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.total = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        for number in re.findall(r"\d+", format_spec):
            width(int(number), "a format width")
        self.total += size(value) * 4 + 2 + sum(int(n) for n in re.findall(r"\d+", format_spec))
        expect(self.total, "a format")
        return super().format_field(value, format_spec)


def method_args(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The arguments of a call, checked first when it is a str method that can amplify its input
    (a join's iterable made a list, so that checking it does not consume it)."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return args
    if name in ("center", "ljust", "rjust", "zfill") and args:
        width(args[0], f"str.{name} width")
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tab, int):
            expect(len(owner) * max(tab, 1), "str.expandtabs")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        replaced(owner, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count", -1))
    elif name == "join" and args:
        args = (list(args[0]),) + args[1:]  # a generator would be consumed by the check
        joined(args[0], owner)
    return args


def _center(value: Any, width_: int = 80) -> str:
    width(width_, "center width")
    return jinja_filters.do_center(value, width_)


def _indent(value: Any, width_: Any = 4, first: bool = False, blank: bool = False) -> str:
    text = str(value)
    pad = len(width_) if isinstance(width_, str) else width_ if isinstance(width_, int) else 0
    expect(len(text) + pad * (text.count("\n") + 1), "an indent")
    return jinja_filters.do_indent(value, width_, first, blank)


@pass_eval_context
def _replace(eval_ctx: Any, value: Any, old: Any, new: Any, count: Any = None) -> str:
    replaced(str(value), str(old), str(new), -1 if count is None else count)
    return jinja_filters.do_replace(eval_ctx, value, old, new, count)


def _format(value: Any, *args: Any, **kwargs: Any) -> str:
    printf(str(value), kwargs or args)
    return jinja_filters.do_format(value, *args, **kwargs)


@pass_eval_context
def _join(eval_ctx: Any, value: Any, d: str = "", attribute: Any = None) -> str:
    items = list(value)
    if attribute is not None:
        items = [jinja_filters.make_attrgetter(eval_ctx.environment, attribute)(i) for i in items]
    joined(items, str(d))
    return jinja_filters.sync_do_join(eval_ctx, items, d)


@pass_environment
def _wordwrap(environment: Any, s: str, *args: Any, **kwargs: Any) -> str:
    wrapstring = kwargs.get("wrapstring", args[2] if len(args) > 2 else None)
    expect(len(str(s)) * (2 + len(str(wrapstring or "\n"))), "a wordwrap")
    return jinja_filters.do_wordwrap(environment, s, *args, **kwargs)


def _batch(value: Any, linecount: int, fill_with: Any = None) -> Any:
    width(linecount, "batch size")
    return jinja_filters.do_batch(value, linecount, fill_with)


def _slice(value: Any, slices: int, fill_with: Any = None) -> Any:
    width(slices, "slice count")
    return jinja_filters.sync_do_slice(value, slices, fill_with)


@pass_eval_context
def _tojson(eval_ctx: Any, value: Any, indent: Any = None) -> Any:
    if isinstance(indent, int):
        expect(size(value) * (indent + 2), "a tojson indent")
    return jinja_filters.do_tojson(eval_ctx, value, indent)


AMPLIFYING = {
    "center": _center,
    "indent": _indent,
    "replace": _replace,
    "format": _format,
    "join": _join,
    "wordwrap": _wordwrap,
    "batch": _batch,
    "slice": _slice,
    "tojson": _tojson,
}


def bounded_filters(filters: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """Every filter with its input and output checked against MAX_SIZE; amplifying ones (those
    taking a width, count or string to insert) also checked before they run."""

    def bounded(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        inner = AMPLIFYING.get(name, fn)
        mark = getattr(inner, "jinja_pass_arg", None)  # Jinja then passes the environment or context first
        passed = mark is not None

        def run(*args: Any, **kwargs: Any) -> Any:
            check(args[1] if passed and len(args) > 1 else args[0] if args else None, f"the input of |{name}")
            result = inner(*args, **kwargs)
            if isinstance(result, Iterator):  # map, select, ...: lazily, one item at a time
                return steps(result)
            return check(result, f"the result of |{name}")

        if passed:
            run.jinja_pass_arg = mark  # type: ignore[attr-defined]
        return run

    return {name: bounded(name, fn) for name, fn in filters.items()}


def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 - Jinja's names
    from jinja2.utils import generate_lorem_ipsum

    expect(n * max * 12, "lipsum")
    return generate_lorem_ipsum(n, html, min, max)
