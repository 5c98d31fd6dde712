"""Print one generation's text as it grows, token by token, without ever taking a character back.

The text of the tokens so far is decoded whole each time, so a character whose bytes span several
tokens is printed once it is complete (until then its decoding ends in U+FFFD). Text that could
be the start of a stop sequence is held back until the next token settles it: the printed text
is always a prefix of the final, cut result.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"  # what a decoder gives for an incomplete UTF-8 sequence


class TextStream:
    def __init__(self, until: Sequence[str] = (), write: Callable[[str], object] | None = None) -> None:
        self.until = [s for s in until if s]
        self.write = write or _stdout
        self.printed = ""
        self.tokens = 0  # tokens generated so far

    def __call__(self, _index: int, text: str) -> None:
        """One more token: `text` is the whole generation so far, decoded."""
        self.tokens += 1
        self._show(self._settled(text))

    def finish(self, final: str) -> None:
        """The generation ended with `final` (cut at its stop sequence): print what is left."""
        self._show(final)

    def _settled(self, text: str) -> str:
        for stop in self.until:
            text = text.split(stop)[0]
        text = text.rstrip(REPLACEMENT)
        held = max((n for stop in self.until for n in range(1, len(stop)) if text.endswith(stop[:n])), default=0)
        return text[: len(text) - held]

    def _show(self, text: str) -> None:
        if len(text) > len(self.printed) and text.startswith(self.printed):
            self.write(text[len(self.printed) :])
            self.printed = text


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
