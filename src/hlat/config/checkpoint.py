"""When checkpoints are written, how, and how many are kept."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CheckpointConfig:
    every: int = 1000  # optimizer steps between checkpoints; the last step is always saved
    keep_last: int = 5  # older checkpoints are deleted once a newer one is complete
    verify: bool = True  # check SHA-256 checksums against the manifest when loading (sizes and safety: always)
    # Write in a background thread (torch.distributed.checkpoint.async_save): the step that saves
    # blocks only while the state is copied; the checkpoint is committed when the write completes.
    async_save: bool = False
    # Archival weights-only checkpoints (archive/step_N/) every this many tokens; never pruned.
    # 0 = none. HLAT 7B kept one every ~100B tokens.
    archive_every_tokens: int = 0
    # Start from these weights with a new optimizer ("resume model states only"): an hlat
    # checkpoint or run directory, or hf:PATH for a Hugging Face LLaMA directory. Ignored when
    # the run directory already has a checkpoint to resume from.
    init_from: str = ""

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        if self.every < 1:
            problems.append(("every", f"must be >= 1, got {self.every}"))
        if self.keep_last < 1:
            problems.append(("keep_last", f"must be >= 1 (the newest checkpoint is what resume needs), got {self.keep_last}"))
        if self.archive_every_tokens < 0:
            problems.append(("archive_every_tokens", f"must be >= 0 (0 = no archive), got {self.archive_every_tokens}"))
        return problems
