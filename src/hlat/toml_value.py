"""One value as TOML source: what config.toml files written by hlat are made of."""

from __future__ import annotations

import json
from typing import Any


def toml_value(value: Any) -> str:
    """Booleans and strings as TOML spells them (a JSON string is a valid TOML basic string);
    numbers as Python prints them (TOML reads ints and floats, inf and nan included, alike);
    lists as TOML arrays of those."""
    if isinstance(value, (bool, str)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return repr(value)
