"""The error every checkpoint problem is reported with (its own module, so that the safe DCP
reader can raise it without importing the manager)."""

import re

from hlat.errors import UserError


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used (missing, corrupt, unsafe, incomplete) or a save that failed
    on some rank; the message says which."""


def refusal(err: Exception) -> str:
    """A weights-only load's refusal in one line, naming the global the pickle asks for (torch's
    message goes on to suggest weights_only=False, which is exactly what must not happen); other
    errors whole."""
    asked = re.search(r"GLOBAL (\S+)", str(err))
    return (
        f"its pickle asks for {asked.group(1)}, which no weights file needs (it could run code)" if asked else str(err)
    )
