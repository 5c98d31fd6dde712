"""Offline token shards (``hlat prepare``): documents tokenized once, read back by memory map.

A shard directory holds ``manifest.json``, the tokenizer it was made with, and per shard
``tokens-NNNNN.bin`` (a flat array of uint16 when every id fits, else uint32) and
``offsets-NNNNN.npy`` (int64, where each document starts; one more entry than documents). Shard
``k`` holds source documents ``[k * docs_per_shard, (k+1) * docs_per_shard)`` in source order,
each one's tokens followed by EOS, exactly what online tokenization yields, so the packed rows
are identical. Shards are written atomically and recorded in the manifest as they finish: an
interrupted ``prepare`` resumes with the first missing shard.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hlat import atomic_files
from hlat.atomic_files import atomic_path, write_manifest
from hlat.config.data_paths import find_tokenizer_file
from hlat.data.documents import STREAM_TOKENS, DocTokens, OnlineDocuments, TokenPieces
from hlat.data.shard_check import check_shard_file
from hlat.data.sources import BadDocument
from hlat.digests import sha256_file
from hlat.errors import DataError
from hlat.output_dir import clear_own_files, is_empty

# what a prepare writes: all that --overwrite removes
SHARD_FILES = ("manifest.json", "tokens-*.bin", "offsets-*.npy", "tokenizer.json", "tokenizer.model")
FORMAT = "hlat_shards"
VERSION = 1


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def shard_tokenizer_path(root: Path) -> Path:
    found = find_tokenizer_file(root)
    if found is not None:
        return found
    raise DataError(
        f"{root} has no tokenizer.json or tokenizer.model: it is not a complete shard "
        "directory; run `hlat prepare` again"
    )


def read_shard_manifest(root: Path) -> dict[str, Any]:
    try:
        manifest = atomic_files.read_manifest_json(root / "manifest.json")
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {root / 'manifest.json'}: {e}; run `hlat prepare` again") from e
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise DataError(f"{root} is not a version-{VERSION} hlat shard directory; run `hlat prepare` again")
    return manifest


def prepare_shards(
    docs: OnlineDocuments,
    out: Path,
    docs_per_shard: int = 100_000,
    skip_bad: bool = False,
    progress: Callable[[int, int], object] | None = None,
    batch_docs: int = 2048,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Tokenize every document of ``docs`` into shards under ``out``; resumes a partial run.
    ``out`` must be missing, empty or hold shards made the same way; ``overwrite`` starts over in
    one that holds other shards (hlat.output_dir: only prepare's own files are removed).
    ``progress(documents, tokens)`` is called after each batch. Returns the manifest."""
    tok = docs.tokenizer
    expected = {
        "format": FORMAT,
        "version": VERSION,
        "fingerprint": docs.fingerprint(),
        "source": docs.name,
        "tokenizer": tok.fingerprint(),
        "eos_id": docs.eos_id,
        "vocab_size": tok.vocab_size,
        "max_doc_chars": docs.max_doc_chars,
        "dtype": token_dtype(tok.vocab_size).name,
        "num_docs": len(docs),
        "docs_per_shard": docs_per_shard,
    }
    manifest: dict[str, Any] = {**expected, "shards": [], "bad": {}, "complete": False}
    if (out / "manifest.json").is_file() and not overwrite:
        old = read_shard_manifest(out)
        changed = [k for k in expected if old.get(k) != expected[k]]
        if changed:
            raise DataError(
                f"{out} holds shards made differently ({', '.join(changed)} differ, e.g. "
                f"{changed[0]}={old.get(changed[0])!r}, now {expected[changed[0]]!r}); "
                "refusing to mix them: use a new directory, or give --overwrite to replace them"
            )
        manifest = old
    elif not is_empty(out):  # a tokenizer or data of the user's: never written over unasked
        if not overwrite:
            raise DataError(
                f"{out} is not empty and holds no hlat shards (no manifest.json): prepare into a new or "
                "empty directory, or give --overwrite to replace what an earlier prepare left there"
            )
        clear_own_files(out, SHARD_FILES, "hlat prepare")
    out.mkdir(parents=True, exist_ok=True)
    write_manifest(out / "manifest.json", manifest)  # first: a directory holding one is prepare's own
    # A prepare killed mid-shard leaves its temporary file (up to a shard's size) behind: a rerun
    # rewrites that shard, so the leftovers are only garbage.
    for stale in (*out.glob(".tokens-*.bin.*"), *out.glob(".offsets-*.npy.*"), *out.glob(".manifest.json.*")):
        stale.unlink(missing_ok=True)
    tok.save(out / tok.FILE_NAME)
    dtype = token_dtype(tok.vocab_size)
    num_shards = -(-len(docs) // docs_per_shard)
    done = len(manifest["shards"])
    if progress is not None and done:
        progress(min(done * docs_per_shard, len(docs)), sum(s["num_tokens"] for s in manifest["shards"]))
    for k in range(done, num_shards):
        first, last = k * docs_per_shard, min((k + 1) * docs_per_shard, len(docs))
        offsets = np.zeros(last - first + 1, dtype=np.int64)
        tokens_path, offsets_path = out / f"tokens-{k:05d}.bin", out / f"offsets-{k:05d}.npy"
        with atomic_path(tokens_path) as tmp, open(tmp, "wb") as f:
            for a in range(first, last, batch_docs):
                b = min(a + batch_docs, last)
                for j, toks in enumerate(docs.tokens(list(range(a, b))), start=a - first):
                    if isinstance(toks, BadDocument):
                        if not skip_bad:
                            raise toks
                        manifest["bad"][str(first + j)] = str(toks)
                        toks = np.empty(0, dtype=np.int64)
                    offsets[j + 1] = offsets[j]
                    for piece in toks if isinstance(toks, TokenPieces) else [toks]:
                        data = piece.astype(dtype).tobytes()
                        f.write(data)
                        offsets[j + 1] += len(piece)
                if progress is not None:
                    progress(b - a, int(offsets[b - first] - offsets[a - first]))
        with atomic_path(offsets_path) as tmp, open(tmp, "wb") as f:
            np.save(f, offsets)
        manifest["shards"].append(
            {
                "tokens": tokens_path.name,
                "offsets": offsets_path.name,
                "num_docs": last - first,
                "num_tokens": int(offsets[-1]),
                "sha256": {tokens_path.name: sha256_file(tokens_path), offsets_path.name: sha256_file(offsets_path)},
            }
        )
        manifest["complete"] = k + 1 == num_shards
        write_manifest(out / "manifest.json", manifest)
    if num_shards == 0 or done == num_shards:
        manifest["complete"] = True
        write_manifest(out / "manifest.json", manifest)
    return manifest


def check_shard_sources(
    entries: list[str], vocab: int, full: bool, cache: Path, share: int = 0, shares: int = 1
) -> str | None:
    """Check share `share` of `shares` of every shard file of the data.source `entries` that are
    shard directories (the ranks of a node split the work; their verdicts then serve all of them);
    the first problem as one line, else None."""
    shards = []
    for entry in entries:
        manifest = read_shard_manifest(Path(entry))
        shards += [(Path(entry), shard, np.dtype(manifest["dtype"])) for shard in manifest["shards"]]
    try:
        for root, shard, dtype in shards[share::shares]:
            _check_shard(root, shard, dtype, vocab, cache, full)
    except (DataError, OSError) as err:
        return str(err)
    return None


def _check_shard(
    root: Path, shard: dict[str, Any], dtype: np.dtype, vocab: int, cache: Path | None, full: bool
) -> None:
    """Both files of one shard against their digests, and its token ids below `vocab`."""
    tokens, offsets = shard["tokens"], shard["offsets"]
    check_shard_file(root / tokens, shard["sha256"][tokens], cache, dtype=dtype, vocab=vocab, full=full)
    check_shard_file(root / offsets, shard["sha256"][offsets], cache, full=full)


class ShardDocuments:
    """Documents read from token shards by memory map: the same ``DocumentTokens`` as online."""

    def __init__(self, root: Path, tokenizer: Any, skip_bad: bool = False, cache: Path | None = None):
        """`cache`: the node's shard verdicts (hlat.data.shard_check); None checks every file."""
        m = read_shard_manifest(root)
        self.root, self.name = root, f"token shards {root} ({m['source']})"
        if not m["complete"]:
            raise DataError(
                f"{root} is incomplete ({len(m['shards'])} shards written): run the same "
                "`hlat prepare` command again to finish it"
            )
        dtype = np.dtype(m["dtype"])
        if tokenizer.vocab_size > np.iinfo(dtype).max + 1:
            raise DataError(
                f"{root} stores {m['dtype']} tokens but the tokenizer has {tokenizer.vocab_size} "
                "ids, more than fit: these shards were made with another tokenizer; run "
                "`hlat prepare` again with this one, into a new directory"
            )
        if tokenizer.fingerprint() != m["tokenizer"]:
            raise DataError(
                f"{root} was made with another tokenizer (fingerprint {m['tokenizer']}, this "
                f"one is {tokenizer.fingerprint()}); use {shard_tokenizer_path(root)} as "
                "data.tokenizer, or run `hlat prepare` again"
            )
        self.eos_id: int = m["eos_id"]
        self.docs_per_shard = m["docs_per_shard"]
        self._num_docs = m["num_docs"]
        self._fingerprint = m["fingerprint"]
        self._bad = {int(i): msg for i, msg in m["bad"].items()}
        self._skip_bad = skip_bad
        self._tokens, self._offsets = [], []
        for s in m["shards"]:
            path = root / s["tokens"]
            if not path.is_file() or path.stat().st_size != s["num_tokens"] * dtype.itemsize:
                raise DataError(
                    f"{path} is missing or has the wrong size (expected {s['num_tokens']} "
                    f"{m['dtype']} tokens): the shards are damaged; run `hlat prepare` again"
                )
            _check_shard(root, s, dtype, tokenizer.vocab_size, cache, full=False)
            # a plain ndarray over the map: slicing an np.memmap costs ~100 us of bookkeeping
            mapped = np.memmap(path, dtype=dtype, mode="r").view(np.ndarray) if s["num_tokens"] else np.empty(0, dtype)
            self._tokens.append(mapped)
            self._offsets.append(np.load(root / s["offsets"]))

    def __len__(self) -> int:
        return self._num_docs

    def fingerprint(self) -> str:
        return self._fingerprint

    def tokens(self, indices: list[int]) -> list[DocTokens]:
        out: list[DocTokens] = []
        for i in indices:
            if i in self._bad:
                out.append(BadDocument(self._bad[i]))
                continue
            k, j = divmod(i, self.docs_per_shard)
            a, b = (int(x) for x in self._offsets[k][j : j + 2])
            mapped = self._tokens[k]
            if b - a > STREAM_TOKENS:  # read from the map a piece at a time
                out.append(
                    TokenPieces(
                        lambda m=mapped, a=a, b=b: (
                            m[p : min(p + STREAM_TOKENS, b)].astype(np.int64) for p in range(a, b, STREAM_TOKENS)
                        )
                    )
                )
            else:
                out.append(mapped[a:b].astype(np.int64))
        return out
