"""Atomic, verified, retained checkpoints of everything a resumed run needs, on any layout.

A checkpoint is a directory `step_NNNNNNNN/`:
  dcp/               model and optimizer state, sharded by torch.distributed.checkpoint and keyed
                     by parameter name, so it loads into any other layout (resharding);
  rank_NNNNN.pt      what belongs to one process: its data-loader position and RNG states;
  shared.pt          what rank 0 alone holds: progress counters and the layout that saved it;
  manifest.json      byte size and SHA-256 of every file, written last.
Every rank hashes the files it wrote itself (its DCP shards and rank file) and sends the digests
to rank 0, which hashes only the shared files and writes the manifest: hashing is spread over the
ranks like the writing. A checkpoint is written under a temporary name and renamed into place only
when every rank has finished, so a crash at any moment leaves the previous checkpoint as the
newest valid one. With `background=True` the DCP data is written by a thread (dcp.async_save)
while training goes on; the saving step blocks only while the state is copied, and a second thread
on each rank hashes once that rank's data is written, then rank 0 commits (manifest, rename,
pruning) once it has every rank's digests. At most one save is in flight: the next save, and
`wait()` at the end of training, wait for it first. Nothing is
unpickled without an allow-list: `.pt` files load with `weights_only=True` and DCP's metadata is
checked first (see safe_metadata.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from hlat.checkpoint.faults import maybe_kill
from hlat.checkpoint.safe_metadata import check_metadata
from hlat.errors import UserError
from hlat.parallel.mesh import collective_timeout

MANIFEST = "manifest.json"
SHARED_FILE = "shared.pt"
DCP_DIR = "dcp"
FORMAT_VERSION = 2


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used (missing, corrupt, unsafe, incomplete); the message says which."""


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns on every single-process save and load that it assumes one process: we know."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def rank_file(rank: int) -> str:
    return f"rank_{rank:05d}.pt"


@dataclass
class SaveStats:
    path: Path  # the committed directory (for a background save: once `wait` returned)
    blocking_s: float  # how long the saving step was held up (staging, for a background save)
    write_s: float | None = None  # from the start of the save to its commit; None while in flight
    background: bool = False


@dataclass
class _Pending:
    done: Future  # this rank's part finished: written, hashed and (rank 0) committed
    stats: SaveStats


class CheckpointManager:
    def __init__(self, directory: Path, keep_last: int | None, verify: bool = True):
        """keep_last None keeps every checkpoint (archives)."""
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.verify = verify
        self._pending: _Pending | None = None
        self._group: dist.ProcessGroup | None = None  # background saves talk on their own group
        self._finisher: ThreadPoolExecutor | None = None  # hashes and commits background saves

    def save(self, step: int, sharded: dict[str, Any], rank_state: dict[str, Any] | None,
             shared: dict[str, Any] | None, background: bool = False) -> SaveStats:
        """Collective: every rank calls it. A background save returns once the state is staged."""
        started = time.perf_counter()
        self.wait()
        final = self.directory / f"step_{step:08d}"
        tmp = self.directory / f".tmp-step_{step:08d}"
        if _rank() == 0:
            for stale in self.directory.glob(".tmp-step_*"):  # saves killed before their commit
                shutil.rmtree(stale, ignore_errors=True)
            (tmp / DCP_DIR).mkdir(parents=True)
        _barrier()
        if rank_state is not None:
            _save_synced(rank_state, tmp / rank_file(_rank()))
        if shared is not None:
            _save_synced(shared, tmp / SHARED_FILE)
        if not background:
            with _single_process_quiet():
                dcp.save(sharded, checkpoint_id=str(tmp / DCP_DIR), no_dist=not _distributed())
            hashes = _gather_hashes(tmp, None)  # rank 0 waits here for every rank's data
            maybe_kill("commit", step, _rank())
            if _rank() == 0:
                self._commit(tmp, final, step, hashes)
            _barrier()
            elapsed = time.perf_counter() - started
            return SaveStats(final, elapsed, elapsed)
        if _distributed() and self._group is None:
            # DCP's collectives run in the writer thread while training uses the default group:
            # sharing one gloo group between two threads would interleave their messages. Same
            # timeout as training's groups (new_group would default to 30 minutes).
            self._group = dist.new_group(backend="gloo", timeout=collective_timeout())
        written = dcp.async_save(sharded, checkpoint_id=str(tmp / DCP_DIR), no_dist=not _distributed(),
                                 process_group=self._group)
        stats = SaveStats(final, time.perf_counter() - started, background=True)
        if self._finisher is None:
            self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hlat-checkpoint-commit")
        self._pending = _Pending(self._finisher.submit(self._finish, written, tmp, step, stats, started), stats)
        return stats

    def _finish(self, written: Future, tmp: Path, step: int, stats: SaveStats, started: float) -> None:
        """Finisher thread, every rank: hash this rank's files once they are written; rank 0
        commits once it has every rank's digests. A rank whose write failed still takes part in
        the gather (reporting the failure), so no other rank is left waiting for it."""
        try:
            written.result()
            failure = None
        except Exception as err:
            failure = f"rank {_rank()} failed to write its data: {err!r}"
        hashes = _gather_hashes(tmp, self._group, failure)
        maybe_kill("commit", step, _rank())
        if _rank() == 0:
            self._commit(tmp, stats.path, step, hashes)
        stats.write_s = time.perf_counter() - started

    def wait(self) -> SaveStats | None:
        """Collective: finish the background save in flight, if any; return its stats."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            pending.done.result()
        except Exception as err:
            raise CheckpointError(f"background save of {pending.stats.path} failed: {err}") from err
        _barrier()
        return pending.stats

    def _commit(self, tmp: Path, final: Path, step: int, hashes: dict[str, dict[str, Any]]) -> None:
        """Rank 0: manifest last (`hashes` from the ranks; the shared files hashed here), then an
        atomic rename; then retention."""
        files = dict(hashes)
        for path in tmp.rglob("*"):
            name = str(path.relative_to(tmp))
            if path.is_file() and name not in files:  # shared.pt, DCP's .metadata
                files[name] = _describe(path)
        files = dict(sorted(files.items()))
        world = dist.get_world_size() if _distributed() else 1
        manifest = {"format": FORMAT_VERSION, "step": step, "world": world, "time": time.time(), "files": files}
        _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        if final.exists():  # a re-save of the same step replaces it
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.directory)
        self._prune()

    def checkpoints(self) -> list[Path]:
        """Committed checkpoint directories, oldest first (validity is checked by `latest`)."""
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.glob("step_*") if (p / MANIFEST).is_file())

    def latest(self) -> Path | None:
        """Collective: the newest checkpoint that passes verification, as checked by rank 0.

        Corrupt or partial checkpoints are reported and skipped in favour of the previous one.
        """
        found: list[str | None] = [None]
        if _rank() == 0:
            for path in reversed(self.checkpoints()):
                try:
                    self.check(path)
                    found[0] = str(path)
                    break
                except CheckpointError as err:
                    print(f"warning: skipping checkpoint {path}: {err}", flush=True)
        if _distributed():
            dist.broadcast_object_list(found, src=0)
        return Path(found[0]) if found[0] else None

    def check(self, path: Path) -> dict[str, Any]:
        """Verify files against the manifest (and checksums if `verify`); return the manifest."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise CheckpointError(f"unreadable {MANIFEST}: {err}") from err
        if manifest.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"format {manifest.get('format')} is not {FORMAT_VERSION}")
        for name, expected in manifest["files"].items():
            file = path / name
            if not file.is_file():
                raise CheckpointError(f"missing {name}")
            if file.stat().st_size != expected["bytes"]:
                raise CheckpointError(f"{name} has {file.stat().st_size} bytes, manifest says {expected['bytes']}")
            if self.verify and _sha256(file) != expected["sha256"]:
                raise CheckpointError(f"{name} fails its SHA-256 check (corrupt)")
        try:
            check_metadata(path / DCP_DIR / ".metadata")
        except (OSError, pickle.UnpicklingError, EOFError) as err:
            raise CheckpointError(f"unsafe or unreadable {DCP_DIR}/.metadata: {err}") from err
        return manifest

    def load_sharded(self, path: Path, sharded: dict[str, Any]) -> None:
        """Fill `sharded` (this layout's state dict) in place from the checkpoint (collective)."""
        with _single_process_quiet():
            dcp.load(sharded, checkpoint_id=str(Path(path) / DCP_DIR), no_dist=not _distributed())

    def load_rank_state(self, path: Path, rank: int) -> dict[str, Any] | None:
        """One process's state as saved, or None if the checkpoint had no such rank."""
        file = Path(path) / rank_file(rank)
        return _load(file) if file.is_file() else None

    def load_shared(self, path: Path) -> dict[str, Any]:
        return _load(Path(path) / SHARED_FILE)

    def _prune(self) -> None:
        if self.keep_last is None:
            return
        for old in self.checkpoints()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def _load(file: Path) -> dict[str, Any]:
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or tampered file; never fall back to full unpickling
        raise CheckpointError(f"cannot load {file}: {err}") from err


def own_files(tmp: Path, rank: int) -> list[Path]:
    """The files one rank writes itself: its rank state, and the DCP data files that torch's
    FileSystemWriter names __<rank>_<n>.distcp. Anything else is hashed by rank 0."""
    return [tmp / rank_file(rank), *sorted((tmp / DCP_DIR).glob(f"__{rank}_*.distcp"))]


def _gather_hashes(tmp: Path, group: dist.ProcessGroup | None, failure: str | None = None) -> dict[str, dict[str, Any]]:
    """Collective over `group`: every rank describes (size, SHA-256) the files it wrote; rank 0
    receives all of them, the others keep their own. A failure on any rank raises on rank 0 (and
    on that rank) after the gather, so nobody waits forever."""
    rank = _rank()
    files: dict[str, dict[str, Any]] = {}
    if failure is None:
        try:
            files = {str(p.relative_to(tmp)): _describe(p) for p in own_files(tmp, rank) if p.is_file()}
        except OSError as err:
            failure = f"rank {rank} could not hash its files: {err}"
    gathered: list[Any] = [(files, failure)]
    if _distributed():
        received: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object((files, failure), received, dst=0, group=group)
        gathered = received if rank == 0 else gathered
    failures = [f for _, f in gathered if f]
    if failures:
        raise CheckpointError("; ".join(failures))
    return {name: entry for part, _ in gathered for name, entry in part.items()}


def _describe(file: Path) -> dict[str, Any]:
    return {"bytes": file.stat().st_size, "sha256": _sha256(file)}


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _save_synced(obj: Any, file: Path) -> None:
    with open(file, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _write_synced(file: Path, data: bytes) -> None:
    with open(file, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
