"""Refuse torch.distributed.checkpoint metadata that would run code when unpickled.

DCP reads its `.metadata` file with plain `pickle.load`, which executes whatever a crafted file
asks. Before DCP touches it, we unpickle it with an allow-list of the classes DCP itself writes;
anything else (os.system, builtins.eval, ...) is an error and nothing runs.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

_ALLOWED_MODULE_PREFIXES = ("torch.distributed.checkpoint.", "torch.distributed.tensor.")
_ALLOWED = {
    ("collections", "OrderedDict"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # maps the name "torch.strided" to the layout object
    ("pathlib", "PosixPath"),  # the checkpoint_id DCP records
    ("pathlib", "WindowsPath"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
}


class _AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # type: ignore[no-untyped-def]
        if module.startswith(_ALLOWED_MODULE_PREFIXES) or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and name.endswith(("float16", "float32", "float64", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: not a class that checkpoint metadata contains")


def check_metadata(path: Path) -> None:
    """Raise pickle.UnpicklingError if `path` holds anything but plain DCP metadata."""
    _AllowListUnpickler(io.BytesIO(path.read_bytes())).load()
