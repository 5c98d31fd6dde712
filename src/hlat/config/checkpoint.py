"""When checkpoints are written, how, and how many are kept."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CheckpointConfig:
    """`[checkpoint]`: when checkpoints are written, how, how many are kept, and what a run starts from."""

    every: int = 1000
    """Optimizer steps between checkpoints; the last step is always saved."""
    keep_last: int = 5
    """Checkpoints kept: older ones are deleted once a newer one is complete."""
    verify: bool = True
    """Check SHA-256 checksums against the manifest when loading (sizes and safety: always)."""
    async_save: bool = False
    """Write in a background thread (torch.distributed.checkpoint.async_save): the step that saves
    blocks only while the state is copied; the checkpoint is committed when the write completes."""
    archive_every_tokens: int = 0
    """Archival weights-only checkpoints (archive/step_N/) every this many tokens, never pruned;
    0 = none. HLAT 7B kept one every ~100B tokens."""
    init_from: str = ""
    """Start from these weights with a new optimizer ("resume model states only"): an hlat
    checkpoint or run directory, or hf:PATH for a Hugging Face model directory. Ignored when the
    run directory already has a checkpoint to resume from. Step, schedule and data loader start
    afresh; [model] must be the source run's but for the RoPE fields, max_seq_len and init_std
    (a long-context stage: docs/parallelism.md)."""

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        if self.every < 1:
            problems.append(("every", f"must be >= 1, got {self.every}"))
        if self.keep_last < 1:
            problems.append(
                ("keep_last", f"must be >= 1 (the newest checkpoint is what resume needs), got {self.keep_last}")
            )
        if self.archive_every_tokens < 0:
            problems.append(("archive_every_tokens", f"must be >= 0 (0 = no archive), got {self.archive_every_tokens}"))
        return problems
