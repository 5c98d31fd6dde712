"""Token shards are verified when a run opens them: each file against the SHA-256 `hlat prepare`
recorded, and every token id below the vocabulary, in one pass over the bytes. A shard changed
after it was prepared (bit rot, a bad copy, a hand edit) would otherwise train silently, and an id
past the vocabulary would crash mid-run naming no file.

A month of restarts must not rehash terabytes: a file that passed leaves a verdict in this node's
cache (<cache>/shard-verdicts/, `hlat.config.data.default_cache_dir`), keyed by the file's path,
device, inode, size and modification time, the digest it matched and the vocabulary it was checked
against. A later open with the same key trusts the verdict. A verdict cannot see what happens to
the bytes after it (a change that keeps size and mtime, bit rot on the disk): `data.verify_shards
full` checks every time.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from hlat.atomic_files import write_atomic
from hlat.digests import CHUNK_BYTES, short_sha256
from hlat.errors import DataError

VERDICTS = "shard-verdicts"
PREPARE_AGAIN = "restore it, or run `hlat prepare` again into a new directory"


def check_shard_file(
    path: Path, sha256: str, cache: Path | None, *, dtype: np.dtype | None = None, vocab: int = 0, full: bool = False
) -> None:
    """Raise DataError naming `path` unless its bytes have SHA-256 `sha256` and, for a tokens file
    (`dtype` given), every id is below `vocab`; a cached verdict (`cache`, unless `full`) skips it."""
    stat = path.stat()
    key = short_sha256(
        f"{path.resolve()}|{stat.st_dev}|{stat.st_ino}|{stat.st_size}|{stat.st_mtime_ns}|{sha256}|{vocab}", 32
    )
    verdict = None if cache is None else cache / VERDICTS / key
    if not full and verdict is not None and verdict.is_file():
        return
    digest, largest = hashlib.sha256(), -1
    item = 1 if dtype is None else dtype.itemsize
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK_BYTES - CHUNK_BYTES % item):
            digest.update(block)
            if dtype is not None and len(block) >= item:
                largest = max(largest, int(np.frombuffer(block, dtype=dtype, count=len(block) // item).max()))
    if digest.hexdigest() != sha256:
        raise DataError(f"{path} fails its SHA-256 check (changed or corrupt since `hlat prepare`): {PREPARE_AGAIN}")
    if dtype is not None and largest >= vocab:
        raise DataError(f"{path} holds token id {largest}, past the vocabulary of {vocab} ids: {PREPARE_AGAIN}")
    if verdict is not None:
        try:
            verdict.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(verdict, json.dumps({"file": str(path.resolve()), "sha256": sha256, "vocab": vocab}) + "\n")
        except OSError:  # a read-only cache only costs the next start a full check
            pass
