"""The error every checkpoint problem is reported with (its own module, so that the safe DCP
reader can raise it without importing the manager)."""

from hlat.errors import UserError


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used (missing, corrupt, unsafe, incomplete) or a save that failed
    on some rank; the message says which."""
