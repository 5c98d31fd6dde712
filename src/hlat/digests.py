"""SHA-256 digests that name content: manifest checksums, fingerprints of data, tokenizers and
prompts, cache keys. Many are persisted (in checkpoints, manifests and cache file names), so the
same input must always give the same hex string."""

from __future__ import annotations

import hashlib
import os

CHUNK_BYTES = 1 << 22  # a file is hashed in pieces of this size, never read whole


def sha256_hex(data: bytes | str) -> str:
    """The hex digest of `data` (a str as its UTF-8 bytes)."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def short_sha256(data: bytes | str, chars: int = 16) -> str:
    """The first `chars` hex digits of sha256_hex(data): a fingerprint or a cache key."""
    return sha256_hex(data)[:chars]


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The hex digest of a file's bytes, read in CHUNK_BYTES pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()
