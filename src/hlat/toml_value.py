"""One value as TOML source: what config.toml files written by hlat are made of."""

from __future__ import annotations

from typing import Any

# TOML's short escapes; every other control character (and DEL) is written \uXXXX.
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(text: str) -> str:
    """A TOML basic string that reads back as `text`: quotes, backslashes and control characters
    escaped, every other character as it is (config.toml is UTF-8). A lone surrogate has no TOML
    spelling (TOML strings are Unicode scalar values): ValueError naming it."""
    out = []
    for c in text:
        code = ord(c)
        if 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"{text!r} holds U+{code:04X}, a lone surrogate, which TOML cannot hold")
        out.append(_ESCAPES.get(c) or (f"\\u{code:04X}" if code < 0x20 or code == 0x7F else c))
    return '"' + "".join(out) + '"'


def toml_value(value: Any) -> str:
    """Booleans and strings as TOML spells them; numbers as Python prints them (TOML reads ints
    and floats, inf and nan included, alike); lists as TOML arrays of those."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return repr(value)
