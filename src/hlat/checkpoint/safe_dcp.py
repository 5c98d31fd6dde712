"""torch.distributed.checkpoint loading that cannot run code from the checkpoint.

Stock DCP unpickles two things freely: the `.metadata` file (plain `pickle.load`) and every
non-tensor entry of the state dict (`DefaultLoadPlanner.load_bytes` calls
`torch.load(weights_only=False)`; hlat's are the optimizer's flattened param_groups: lr, betas,
eps, ...). `load` reads both safely: the metadata through the exact allow-list of
safe_metadata.py, the non-tensor entries with `torch.load(weights_only=True)` (plain numbers,
strings, tuples, lists, dicts). Tensors were already read with `weights_only=True` by DCP. The
data files the metadata names must be plain file names inside the checkpoint's dcp/ directory
(read_metadata checks that too, so `CheckpointManager.check` skips such a checkpoint).
"""

from __future__ import annotations

import io
import pickle
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from hlat.checkpoint.errors import CheckpointError, refusal
from hlat.checkpoint.safe_metadata import read_metadata

METADATA_FILE = ".metadata"


class SafeFileSystemReader(dcp.FileSystemReader):
    """Reads the global `.metadata` through the allow-list. There is deliberately no `rank`
    keyword: DCP would otherwise fall back to per-rank metadata files, which hlat never writes."""

    def read_metadata(self) -> Metadata:  # type: ignore[override]
        file = Path(self.path) / METADATA_FILE
        try:
            metadata = read_metadata(file)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
            raise CheckpointError(f"{file}: {err}") from err
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id  # as FileSystemReader.read_metadata does
        return metadata


class SafeLoadPlanner(dcp.DefaultLoadPlanner):
    """Non-tensor entries are loaded with weights_only=True instead of full unpickling."""

    def __init__(self, directory: Path):
        super().__init__()
        self.directory = directory

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        name = read_item.dest_index.fqn
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as err:
            file = self.directory / self.metadata.storage_data[read_item.storage_index].relative_path
            raise CheckpointError(f"{file}: the non-tensor entry {name!r} is refused: {refusal(err)}") from err
        # what DefaultLoadPlanner.load_bytes does with the value it unpickled
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[name], loaded)
        else:
            self.state_dict[name] = loaded


def load(state: dict[str, Any], directory: Path, no_dist: bool) -> None:
    """Fill `state` in place from the DCP checkpoint in `directory` (collective unless no_dist).
    Raises CheckpointError with every failing rank's message."""
    try:
        dcp.load(
            state, storage_reader=SafeFileSystemReader(directory), planner=SafeLoadPlanner(directory), no_dist=no_dist
        )
    except CheckpointException as err:  # DCP's own wrapper (a BaseException) of every rank's failure
        failures = "; ".join(
            f"rank {rank}: {''.join(traceback.format_exception_only(type(exc), exc)).strip()}"
            for rank, (exc, _) in sorted(err.failures.items())
        )
        raise CheckpointError(f"cannot load {directory}: {failures}") from err
