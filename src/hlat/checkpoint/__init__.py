from hlat.checkpoint.manager import CheckpointError, CheckpointManager

__all__ = ["CheckpointError", "CheckpointManager"]
