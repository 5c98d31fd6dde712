"""Errors that carry enough context for a user to fix their input.

`UserError` marks an expected failure: bad input (a configuration, a data row, a checkpoint, a
Hugging Face directory), not a bug. The `hlat` command prints its message alone and exits with
code 2; other exceptions keep their traceback.
"""

from __future__ import annotations

import difflib


class UserError(Exception):
    """An expected failure whose message names what to fix; `hlat` shows it without a traceback."""


class DataError(UserError, ValueError):
    """Data that cannot be used as configured: a source (a missing column, a corrupt file, too few
    documents), a tokenizer or token shards. The message names the file and the setting to change.
    A ValueError too, for the callers that catch those around data and tokenizer loading."""


class ConfigError(UserError, ValueError):
    """An invalid configuration: every problem names its field and the fix."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        lines = [f"  {field}: {message}" for field, message in problems]
        super().__init__("invalid configuration:\n" + "\n".join(lines))


class ResumeError(UserError, ValueError):
    """A checkpoint that cannot resume this run as configured (e.g. its data position was made
    with other data settings); the message names the setting and the value to resume with."""


def did_you_mean(word: str, choices: list[str], prefix: str = "") -> str:
    """The tail of an unknown-name message: " 'word'; did you mean 'PREFIXclosest'?", or " 'word'"
    when no choice is close."""
    close = difflib.get_close_matches(word, choices, n=1)
    return f" {word!r}; did you mean '{prefix}{close[0]}'?" if close else f" {word!r}"
