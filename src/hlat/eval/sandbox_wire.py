"""The only thing that crosses between a generated solution and the test that judges it: plain
values in a tagged JSON encoding, in length-prefixed frames, never pickle.

Decoding builds only None, bool, int, float, complex, str, bytes, list, tuple, dict, set and
frozenset; anything else, a frame over MAX_FRAME bytes or nesting deeper than MAX_DEPTH is a
WireError. The receiver never runs code chosen by the sender.

Imported by hlat.eval.sandbox and, as a top-level module, by the two sandbox processes.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

MAX_FRAME = 16 << 20  # bytes of one message
MAX_DEPTH = 64


class WireError(Exception):
    """A value that cannot cross, or a malformed, oversized or truncated frame."""


def encode(value: Any, depth: int = 0) -> list[Any]:
    if depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH}")
    d = depth + 1
    if value is None:
        return ["n"]
    if isinstance(value, bool):
        return ["b", bool(value)]
    if isinstance(value, int):
        return ["i", format(int(value), "x")]  # hex: no str<->int digit limit, exact
    if isinstance(value, float):
        return ["f", float(value).hex()]  # exact, and keeps nan, inf and -0.0
    if isinstance(value, complex):
        return ["c", value.real.hex(), value.imag.hex()]
    if isinstance(value, str):
        return ["s", str(value)]
    if isinstance(value, (bytes, bytearray)):
        return ["y", base64.b64encode(bytes(value)).decode()]
    if isinstance(value, list):
        return ["l", [encode(v, d) for v in value]]
    if isinstance(value, tuple):
        return ["t", [encode(v, d) for v in value]]
    if isinstance(value, dict):
        return ["d", [[encode(k, d), encode(v, d)] for k, v in value.items()]]
    if isinstance(value, frozenset):
        return ["z", [encode(v, d) for v in value]]
    if isinstance(value, set):
        return ["e", [encode(v, d) for v in value]]
    raise WireError(
        f"a {type(value).__name__} cannot cross the sandbox boundary (plain data only: "
        "None, bool, int, float, complex, str, bytes, list, tuple, dict, set)"
    )


def decode(data: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH}")
    try:
        tag, *rest = data
        d = depth + 1
        if tag == "n" and not rest:
            return None
        if tag == "b" and type(rest[0]) is bool:
            return rest[0]
        if tag == "i" and type(rest[0]) is str:
            return int(rest[0], 16)
        if tag == "f" and type(rest[0]) is str:
            return float.fromhex(rest[0])
        if tag == "c":
            return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
        if tag == "s" and type(rest[0]) is str:
            return rest[0]
        if tag == "y" and type(rest[0]) is str:
            return base64.b64decode(rest[0], validate=True)
        if tag in ("l", "t", "e", "z") and type(rest[0]) is list:
            items = [decode(v, d) for v in rest[0]]
            return {"l": list, "t": tuple, "e": set, "z": frozenset}[tag](items)
        if tag == "d" and type(rest[0]) is list:
            return {decode(k, d): decode(v, d) for k, v in rest[0]}
    except WireError:
        raise
    except (TypeError, ValueError, IndexError, OverflowError, RecursionError) as err:
        raise WireError(f"malformed value: {err}") from None
    raise WireError(f"malformed value with tag {str(data)[:40]!r}")


def send(fd: int, message: list[Any]) -> None:
    """Write one frame: 4-byte big-endian length, then UTF-8 JSON."""
    body = json.dumps(message, allow_nan=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    if len(body) > MAX_FRAME:
        raise WireError(f"message of {len(body)} bytes is over the {MAX_FRAME}-byte limit")
    view = memoryview(len(body).to_bytes(4, "big") + body)
    while view:
        view = view[os.write(fd, view) :]


def receive(fd: int) -> list[Any]:
    """Read one frame; WireError at end of stream or on anything malformed."""
    size = int.from_bytes(_read_exactly(fd, 4), "big")
    if size > MAX_FRAME:
        raise WireError(f"frame of {size} bytes is over the {MAX_FRAME}-byte limit")
    try:
        message = json.loads(_read_exactly(fd, size).decode("utf-8", "surrogatepass"))
    except ValueError as err:
        raise WireError(f"malformed frame: {err}") from None
    except RecursionError:  # json gives up at the interpreter's recursion limit, far past MAX_DEPTH
        raise WireError(f"malformed frame: nested deeper than {MAX_DEPTH}") from None
    if type(message) is not list or not message or type(message[0]) is not str:
        raise WireError("malformed frame: expected a list starting with a string")
    return message


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise WireError("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
