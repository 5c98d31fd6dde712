"""Data positions as a peer group sends them (hlat.train.elastic.shares), checked before use: a
length is bounded before anything is allocated for it, every share has exactly one sender (the
group it was dealt to), and a position has the shape and the fixed values of the loader's own.
A bad value is a BadPeerValue naming its sender; the step it arrived in does not commit."""

from __future__ import annotations

import math
from typing import Any

MAX_POSITION_BYTES = 1 << 20  # a share's position as JSON: a few kB per data source, never near this
# fields of a share's position that every group computes alike (the rest moves as the share is read)
_FIXED = ("version", "seed", "dp_rank", "dp_size", "seq_len", "virtual_shards", "sources", "weights")


class BadPeerValue(Exception):
    """`sender` (a replica rank of the step's quorum) sent what no group of this run sends."""

    def __init__(self, sender: int, why: str):
        super().__init__(why)
        self.sender = sender


def check_lengths(lengths: list[list[int]], owned: list[list[int]]) -> None:
    """`lengths[r][j]`: the bytes of share j's position that replica rank r sent; `owned[r]`: the
    shares dealt to r, the only ones it may send, each of 1 to MAX_POSITION_BYTES bytes."""
    for sender, (row, mine) in enumerate(zip(lengths, owned)):
        for share, length in enumerate(row):
            if share in mine and not 0 < length <= MAX_POSITION_BYTES:
                raise BadPeerValue(
                    sender, f"share {share}'s position as {length:,} bytes (1 to {MAX_POSITION_BYTES:,})"
                )
            if share not in mine and length != 0:
                raise BadPeerValue(sender, f"a position of share {share}, which another group holds")


def position_problem(got: Any, want: Any, where: str = "") -> str | None:
    """How `got` differs from `want` (a position of the same share made here) in shape, in a fixed
    value or by a negative count; None when it is a position this loader can load."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or got.keys() != want.keys():
            return f"{where} has other keys than the loader's".lstrip()
        for key in want:
            if where == "" and key in _FIXED and got[key] != want[key]:
                return f"has {key}={got[key]!r}, not {want[key]!r}"
            problem = position_problem(got[key], want[key], f"{where}.{key}" if where else key)
            if problem:
                return problem
        return None
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{where} is not a list of {len(want)}"
        return next(
            filter(None, (position_problem(g, w, f"{where}[{i}]") for i, (g, w) in enumerate(zip(got, want)))), None
        )
    if isinstance(want, bool | str):
        return None if type(got) is type(want) else f"{where} is not a {type(want).__name__}"
    if isinstance(want, int):
        ok = type(got) is int and got >= (-1 if where == "current" else 0)  # current -1: no source begun
        return None if ok else f"{where}={got!r} is not a count"
    if isinstance(want, float):
        ok = type(got) in (int, float) and math.isfinite(got)
        return None if ok else f"{where}={got!r} is not a finite number"
    return None if got == want else f"{where} differs"
