"""Output directories of `hlat export` and `hlat prepare`: never written over data the user did
not name.

A command writes into a directory that is missing or empty, or (prepare) one that holds its own
earlier output. Anything else is refused unless `--overwrite` is given, and `--overwrite` removes
only the files the command itself writes (by name, and the temporary files of its atomic writes);
a directory holding anything else is refused even then, before anything is removed: hlat never
deletes a user's unrelated files.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from pathlib import Path

from hlat.errors import UserError


def is_empty(directory: Path) -> bool:
    return not directory.exists() or (directory.is_dir() and not any(directory.iterdir()))


def clear_own_files(directory: Path, patterns: Iterable[str], command: str) -> None:
    """--overwrite: remove the files of `directory` that `command` writes (names matching
    `patterns`, or `.<such a name>.<random>` left by a killed atomic write); refused, with nothing
    removed, if the directory holds anything else."""
    patterns = list(patterns)
    if not directory.is_dir():
        raise UserError(f"{directory} is not a directory: give {command} a directory to write into")

    def own(entry: Path) -> bool:
        name = entry.name.removeprefix(".").rsplit(".", 1)[0] if entry.name.startswith(".") else entry.name
        return (entry.is_file() or entry.is_symlink()) and any(fnmatch.fnmatchcase(name, p) for p in patterns)

    entries = sorted(directory.iterdir())
    foreign = [entry.name for entry in entries if not own(entry)]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise UserError(
            f"--overwrite: {directory} holds files {command} does not write ({shown}); it clears only its own "
            "earlier output: choose a new or empty directory"
        )
    for entry in entries:
        entry.unlink()  # a symbolic link is removed itself, never followed
