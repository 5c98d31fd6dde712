"""Errors that carry enough context for a user to fix their input."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration: every problem names its field and the fix."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        lines = [f"  {field}: {message}" for field, message in problems]
        super().__init__("invalid configuration:\n" + "\n".join(lines))
