"""Files that appear whole or not at all, and the JSON manifests that checksum them.

Every file hlat must not leave half-written (checkpoint files and manifests, token shards, cached
Arrow copies and tokenizers, a rewritten metrics.jsonl) is written to a temporary file beside its
destination, synced, renamed over it, and the directory synced: a crash at any moment leaves the
old file or the new one. The temporary name is `.<name>.<random>`, so a caller can sweep what a
killed writer left with a glob.

No write follows a symbolic link planted where hlat writes: a file is created under a fresh
temporary name (O_EXCL, which never follows a link) and renamed over its destination, which is
refused if it is a link (SymlinkRefused); an appended file (metrics.jsonl) is opened with
O_NOFOLLOW; a directory hlat names itself (checkpoints/, tensorboard/, ...) is refused if it is a
link (`make_dir`). The directories a user names (a run directory, an output directory) may be links.

A manifest is JSON written atomically. Its files are described by `file_entry` as
{"bytes": size, "sha256": hex} and checked by `file_problem`; an entry without "bytes" (a token
shard manifest records only digests) is checked by digest alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hlat.digests import sha256_file
from hlat.errors import UserError


class SymlinkRefused(UserError, OSError):
    """A destination that is a symbolic link: hlat writes over regular files only."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A new empty temporary file beside `path` for the body to write (by name, as writers such
    as torch.save or pyarrow want); once the body returns it is synced and renamed to `path`. If
    the body raises, the temporary file is removed and `path` is untouched. A symbolic link at
    `path` is refused: renaming over it would silently cut the link."""
    path = refuse_symlink(path)
    temporary = _create_beside(path)
    try:
        yield temporary
        fd = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def refuse_symlink(path: str | os.PathLike[str]) -> Path:
    """`path`, unless it is a symbolic link (SymlinkRefused: hlat never writes through one)."""
    path = Path(path)
    if path.is_symlink():
        raise SymlinkRefused(f"refusing to write through the symbolic link {path}; remove it or choose another path")
    return path


def make_dir(path: str | os.PathLike[str]) -> Path:
    """Directory `path` (and its parents), created if missing; refused if `path` is a symbolic
    link (its parents may be: a user's run directory on another disk)."""
    path = refuse_symlink(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def append_text(path: str | os.PathLike[str], text: str) -> None:
    """Append `text` to `path` (created if missing) in one write, never through a symbolic link."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if Path(path).is_symlink():
            raise SymlinkRefused(f"refusing to write through the symbolic link {path}; remove it") from err
        raise
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def copy_atomic(source: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Replace `path` with a copy of `source` atomically (see atomic_path); `source` may be
    `path` itself (the copy is made beside it, then renamed)."""
    with atomic_path(path) as temporary:
        shutil.copyfile(source, temporary)


def _create_beside(path: Path) -> Path:
    """Create `.<name>.<random>` in path's directory exclusively, with the permissions a plain
    open gives (tempfile.mkstemp would make it private to the owner)."""
    while True:
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        try:
            os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return temporary
        except FileExistsError:
            continue


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Replace `path` with `data` (a str as UTF-8) atomically (see atomic_path)."""
    with atomic_path(path) as temporary:
        temporary.write_bytes(data.encode() if isinstance(data, str) else data)


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename or creation in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(path: str | os.PathLike[str], manifest: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(manifest, indent=1))


def read_manifest_json(path: str | os.PathLike[str]) -> Any:
    """The parsed JSON of a manifest; OSError or ValueError (JSON or UTF-8) if it cannot be read.
    Callers check its shape and say what to do about a bad one."""
    return json.loads(Path(path).read_text())


def file_entry(path: str | os.PathLike[str]) -> dict[str, Any]:
    """How a manifest describes a file: its size and SHA-256."""
    return {"bytes": os.stat(path).st_size, "sha256": sha256_file(path)}


def file_problem(root: Path, name: str, entry: dict[str, Any], digest: bool = True) -> str | None:
    """What is wrong with file `name` under `root` against its manifest entry (None: nothing):
    missing, of another size, or (with `digest`) of another SHA-256."""
    file = root / name
    if not file.is_file():
        return f"missing {name}"
    size = file.stat().st_size
    if "bytes" in entry and size != entry["bytes"]:
        return f"{name} has {size} bytes, manifest says {entry['bytes']}"
    if digest and sha256_file(file) != entry["sha256"]:
        return f"{name} fails its SHA-256 check (corrupt)"
    return None
