"""Read torch.distributed.checkpoint's `.metadata` without letting a crafted file run code.

DCP writes its metadata with `pickle` and reads it back with plain `pickle.load`, which runs
whatever a crafted file asks. hlat reads it here instead, with an unpickler that resolves only the
exact (module, qualified name) pairs that DCP's metadata is made of. There are no prefixes and no
dotted names: pickle protocol 4 resolves a dotted qualified name attribute by attribute, so
`("torch.distributed.checkpoint.filesystem", "os.system")` would reach os.system through a module
that imports os. Anything not in the list is refused before it is looked up, so nothing runs.
The data files the metadata names must be plain file names beside it: a crafted `../x` or
absolute path would make a load read outside the checkpoint.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        (_DCP_METADATA, "Metadata"),
        (_DCP_METADATA, "MetadataIndex"),
        (_DCP_METADATA, "StorageMeta"),
        (_DCP_METADATA, "TensorStorageMetadata"),
        (_DCP_METADATA, "BytesStorageMetadata"),
        (_DCP_METADATA, "ChunkStorageMetadata"),
        (_DCP_METADATA, "TensorProperties"),
        (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),  # maps the name "torch.strided" to the layout object
        ("torch", "Size"),
        ("collections", "OrderedDict"),
        ("pathlib", "PosixPath"),  # the checkpoint_id DCP records (Python >= 3.13: pathlib._local)
        ("pathlib", "WindowsPath"),
        ("pathlib._local", "PosixPath"),
        ("pathlib._local", "WindowsPath"),
        # dtypes are module attributes of torch (torch.float32, ...): objects, not callables
        *(("torch", name) for name in dir(torch) if isinstance(getattr(torch, name), torch.dtype)),
    }
)


class _AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name}: not a class that checkpoint metadata contains"
            )
        return super().find_class(module, name)


def read_metadata(path: Path) -> Metadata:
    """DCP's metadata at `path`; pickle.UnpicklingError if it holds anything else, ValueError if it
    names a data file that is not a plain file name in its directory."""
    metadata = _AllowListUnpickler(io.BytesIO(Path(path).read_bytes())).load()
    if not isinstance(metadata, Metadata):
        raise pickle.UnpicklingError(f"holds a {type(metadata).__name__}, not DCP metadata")
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not name or name != os.path.basename(name) or name.startswith("."):
            raise ValueError(f"names the data file {name!r}, which is not a plain file name in {Path(path).parent}")
    return metadata
