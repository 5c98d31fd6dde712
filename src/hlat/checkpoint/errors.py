"""The error every checkpoint problem is reported with (its own module, so that the safe DCP
reader can raise it without importing the manager)."""

from hlat.errors import UserError


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used (missing, corrupt, unsafe, incomplete) or a save that failed
    on some rank; the message says which."""


def refusal(err: Exception) -> str:
    """The line of torch's weights-only refusal that names what was refused (the rest of it
    suggests loading with weights_only=False, which is exactly what must not happen); other
    errors whole."""
    lines = [line.strip() for line in str(err).splitlines()]
    return next((line for line in lines if "GLOBAL" in line), str(err))
