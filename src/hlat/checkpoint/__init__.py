from hlat.checkpoint.config import CheckpointConfig
from hlat.checkpoint.manager import CheckpointError, CheckpointManager

__all__ = ["CheckpointConfig", "CheckpointError", "CheckpointManager"]
