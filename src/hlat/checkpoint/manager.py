"""Atomic, verified, retained checkpoints of everything a resumed run needs, on any layout.

A checkpoint is a directory `step_NNNNNNNN/`:
  dcp/               model and optimizer state, sharded by torch.distributed.checkpoint and keyed
                     by parameter name, so it loads into any other layout (resharding);
  rank_NNNNN.pt      what belongs to one process: its data-loader position and RNG states;
  shared.pt          what rank 0 alone holds: progress counters and the layout that saved it;
  manifest.json      byte size and SHA-256 of every file, written last.
Every rank hashes the files it wrote itself (its DCP shards and rank file) and sends the digests
to the others; rank 0 hashes only the shared files and writes the manifest: hashing is spread over the
ranks like the writing. A checkpoint is written under a temporary name and renamed into place only
when every rank has finished, so a crash at any moment leaves the previous checkpoint as the
newest valid one. With `background=True` the DCP data is written by a thread (dcp.async_save)
while training goes on; the saving step blocks only while the state is copied, and a second thread
on each rank hashes once that rank's data is written, then rank 0 commits (manifest, rename,
pruning) once it has every rank's digests. At most one save is in flight: the next save, and
`wait()` at the end of training, wait for it first.

Every step of a save that is hlat's own (creating the temporary directory, writing the rank files,
hashing, committing) ends with an agreement of all ranks (an all-gather of each rank's error or
None): if it failed anywhere, every rank raises CheckpointError naming the failing ranks and
their errors, at once, instead of waiting in a barrier for the collective timeout. DCP's own
steps propagate their failures to every rank themselves.

Verification at resume (`check`, `latest`) is shared: each rank checks its share of the manifest
and all ranks agree on the verdict, so a corrupt checkpoint is skipped by every rank together.

Nothing is unpickled except through an allow-list: `.pt` files load with `weights_only=True`,
DCP's metadata through the exact allow-list of safe_metadata.py, and DCP's non-tensor entries
(the optimizer's param_groups) with `weights_only=True` (safe_dcp.py), whether or not
`verify` is set.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from hlat import __version__, atomic_files
from hlat.atomic_files import atomic_path, file_entry, file_problem, fsync_dir, make_dir, write_manifest
from hlat.checkpoint import safe_dcp
from hlat.checkpoint.errors import CheckpointError, refusal
from hlat.checkpoint.safe_metadata import read_metadata
from hlat.faults import maybe_fail, maybe_kill
from hlat.parallel.mesh import collective_timeout

MANIFEST = "manifest.json"
SHARED_FILE = "shared.pt"
DCP_DIR = "dcp"
METADATA = f"{DCP_DIR}/{safe_dcp.METADATA_FILE}"
FORMAT_VERSION = 2
REJECTED_DIR = "rejected"  # checkpoints that failed verification, set aside (CheckpointManager.set_aside)


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


def _world() -> int:
    return dist.get_world_size() if _distributed() else 1


def _agree(failure: str | None, group: dist.ProcessGroup | None = None) -> None:
    """Collective over `group`: raise CheckpointError on every rank if any rank failed, naming
    each failing rank's error. Replaces a barrier: it waits for the same ranks, but a failure
    reaches everyone at once."""
    failures = [failure]
    if _distributed():
        failures = [None] * dist.get_world_size(group)
        dist.all_gather_object(failures, failure, group=group)
    _raise_any(failures)


def _raise_any(failures: list[str | None]) -> None:
    """CheckpointError naming every rank's failure (index = rank), if there is one."""
    failed = [f"rank {rank}: {f}" if _distributed() else f for rank, f in enumerate(failures) if f]
    if failed:
        raise CheckpointError("; ".join(failed))


@contextlib.contextmanager
def _on_every_rank(what: str, group: dist.ProcessGroup | None = None) -> Iterator[None]:
    """Run the body's part of a save step on this rank, then agree (_agree): an error in the body
    on any rank is raised on every rank as CheckpointError("... rank R: failed WHAT: error")."""
    failure = None
    try:
        yield
    except Exception as err:
        failure = f"failed {what}: {_failure_line(err)}"
    _agree(failure, group)


NO_SPACE = "no space left on device"


def _disk_full(err: BaseException) -> bool:
    """Whether `err` comes from a full disk or quota: an OSError ENOSPC/EDQUOT anywhere in its
    chain, in DCP's per-rank failures, or torch.save's short-write message ("unexpected pos"),
    which keeps the OSError only as its context."""
    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "unexpected pos" in str(e) or "No space left on device" in str(e):
            return True
        todo += [e.__cause__, e.__context__]
        if isinstance(e, CheckpointException):
            todo += [failure[0] for failure in e.failures.values()]
    return False


def _failure_line(err: BaseException) -> str:
    """One line for a failed save step: a full disk as such, anything else as it was raised."""
    return NO_SPACE if _disk_full(err) else repr(err)


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
    def __init__(
        self, directory: Path, keep_last: int | None, verify: bool = True, guard: Callable[[], None] | None = None
    ):
        """keep_last None keeps every checkpoint (archives). `guard`: called on rank 0 before each
        save writes anything; what it raises stops the save on every rank (the run's lock check)."""
        self.directory = Path(directory)
        self.guard = guard
        self.keep_last = keep_last
        self.rejected: list[tuple[Path, str]] = []  # what the last `latest` skipped, and why
        self.verify = verify
        self._pending: _Pending | None = None
        self._group: dist.ProcessGroup | None = None  # background saves talk on their own group
        self._finisher: ThreadPoolExecutor | None = None  # hashes and commits background saves

    def save(
        self,
        step: int,
        sharded: dict[str, Any],
        rank_state: dict[str, Any] | None,
        shared: dict[str, Any] | None,
        background: bool = False,
    ) -> SaveStats:
        """Collective: every rank calls it. A background save returns once the state is staged.
        A failure of any rank raises CheckpointError on every rank (see the module docstring); a
        full disk says so, naming the checkpoint a resume starts from."""
        try:
            return self._save(step, sharded, rank_state, shared, background)
        except CheckpointError as err:
            if NO_SPACE not in str(err):
                raise
            raise CheckpointError(f"{err}; {self._intact()}") from err

    def _intact(self) -> str:
        """What survives a failed save, and what to do about a full disk."""
        committed = self.checkpoints()
        kept = f"{committed[-1]} is intact and a resume starts from it" if committed else "no earlier checkpoint exists"
        return f"{kept}; free space under {self.directory} (or lower --checkpoint.keep_last) and run again"

    def _save(
        self,
        step: int,
        sharded: dict[str, Any],
        rank_state: dict[str, Any] | None,
        shared: dict[str, Any] | None,
        background: bool,
    ) -> SaveStats:
        started = time.perf_counter()
        self.wait()
        final = self.directory / f"step_{step:08d}"
        tmp = self.directory / f".tmp-step_{step:08d}"
        rank = _rank()
        # Every rank agrees on the guard, though only rank 0 holds one (the run's lock): a collective
        # entered by rank 0 alone would pair with the others' next one and hang the save.
        with _on_every_rank("to save"):
            if rank == 0 and self.guard is not None:
                self.guard()
        with _on_every_rank(f"to create {tmp}"):
            if rank == 0:
                maybe_fail("mkdir", step, rank)
                make_dir(self.directory)
                for stale in self.directory.glob(".tmp-step_*"):  # saves killed before their commit
                    _remove(stale)
                tmp.mkdir()  # a new directory: a link planted at its name was removed above
                (tmp / DCP_DIR).mkdir()
        with _on_every_rank(f"to write its files in {tmp}"):
            maybe_fail("write", step, rank)
            if rank_state is not None:
                _save_synced(rank_state, tmp / rank_file(rank))
            if shared is not None:
                _save_synced(shared, tmp / SHARED_FILE)
        if not background:
            try:
                with _single_process_quiet():
                    dcp.save(sharded, checkpoint_id=str(tmp / DCP_DIR), no_dist=not _distributed())
            except (Exception, CheckpointException) as err:  # DCP's is a BaseException
                if not _disk_full(err):
                    raise
                raise CheckpointError(f"failed to write its data in {tmp}: {_failure_line(err)}") from err
            hashes = _gather_hashes(tmp, step, None)
            self._commit_on_rank0(tmp, final, step, hashes, None)
            elapsed = time.perf_counter() - started
            return SaveStats(final, elapsed, elapsed)
        if _distributed() and self._group is None:
            # DCP's collectives run in the writer thread while training uses the default group:
            # sharing one gloo group between two threads would interleave their messages. Same
            # timeout as training's groups (new_group would default to 30 minutes).
            self._group = dist.new_group(backend="gloo", timeout=collective_timeout())
        written = dcp.async_save(
            sharded, checkpoint_id=str(tmp / DCP_DIR), no_dist=not _distributed(), process_group=self._group
        )
        stats = SaveStats(final, time.perf_counter() - started, background=True)
        if self._finisher is None:
            self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hlat-checkpoint-commit")
        self._pending = _Pending(self._finisher.submit(self._finish, written, tmp, step, stats, started), stats)
        return stats

    def _finish(self, written: Future, tmp: Path, step: int, stats: SaveStats, started: float) -> None:
        """Finisher thread, every rank: hash this rank's files once they are written; rank 0
        commits once it has every rank's digests. A rank whose write failed still takes part in
        both agreements (reporting the failure), so no rank is left waiting and all of them raise."""
        maybe_kill("writing", step, _rank())
        try:
            written.result()
            failure = None
        except (Exception, CheckpointException) as err:
            failure = f"failed to write its data: {_failure_line(err)}"
        hashes = _gather_hashes(tmp, step, self._group, failure)
        self._commit_on_rank0(tmp, stats.path, step, hashes, self._group)
        stats.write_s = time.perf_counter() - started

    def _commit_on_rank0(
        self, tmp: Path, final: Path, step: int, hashes: dict[str, dict[str, Any]], group: dist.ProcessGroup | None
    ) -> None:
        """Collective over `group`: rank 0 commits; every rank returns once it has (or raises)."""
        maybe_kill("commit", step, _rank())
        with _on_every_rank(f"to commit {final}", group):
            if _rank() == 0:
                maybe_fail("commit", step, 0)
                self._commit(tmp, final, step, hashes)

    def wait(self) -> SaveStats | None:
        """Collective: finish the background save in flight, if any; return its stats. Its
        failure on any rank raises CheckpointError on every rank."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            pending.done.result()  # ends with the commit agreement: every rank has seen the commit
        except Exception as err:
            full = f"; {self._intact()}" if NO_SPACE in str(err) else ""
            raise CheckpointError(f"background save of {pending.stats.path} failed: {err}{full}") from err
        return pending.stats

    def _commit(self, tmp: Path, final: Path, step: int, hashes: dict[str, dict[str, Any]]) -> None:
        """Rank 0: manifest last (`hashes` from the ranks; the shared files hashed here), then an
        atomic rename; then retention."""
        files = dict(hashes)
        for path in tmp.rglob("*"):
            name = str(path.relative_to(tmp))
            if path.is_file() and name not in files:  # shared.pt, DCP's .metadata
                files[name] = file_entry(path)
        files = dict(sorted(files.items()))
        manifest = {
            "format": FORMAT_VERSION, "hlat": __version__, "step": step, "world": _world(), "time": time.time(),
            "files": files,
        }  # fmt: skip
        write_manifest(tmp / MANIFEST, manifest)
        if final.exists() or final.is_symlink():  # a re-save of the same step replaces it
            _remove(final)
        os.replace(tmp, final)
        fsync_dir(self.directory)
        self._prune()

    def checkpoints(self) -> list[Path]:
        """Committed checkpoint directories, oldest first (validity is checked by `latest`)."""
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.glob("step_*") if (p / MANIFEST).is_file())

    def latest(self) -> Path | None:
        """Collective: the newest checkpoint that passes `check` on every rank's share.

        Corrupt, partial, incomplete or unsafe checkpoints are reported (by rank 0) and skipped by
        every rank together in favour of the previous one; `rejected` then lists each skipped one
        with why (newest first), for the caller to stop on (none left) or set aside (set_aside).
        """
        found = [str(p) for p in self._step_dirs()]
        if _distributed():  # every rank tries the same candidates, in the same order
            listing = [found]
            dist.broadcast_object_list(listing, src=0)
            found = listing[0]
        self.rejected = []
        for path in map(Path, reversed(found)):
            try:
                self.check(path)
                return path
            except CheckpointError as err:
                self.rejected.append((path, str(err)))
                if _rank() == 0:
                    print(f"warning: skipping checkpoint {path}: {err}", flush=True)
        return None

    def _step_dirs(self) -> list[Path]:
        """Every checkpoint directory, committed or not (a step directory always holds a manifest
        once committed: one without it is damaged, not in progress)."""
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.glob("step_*") if p.is_dir() and not p.is_symlink())

    def set_aside(self) -> None:
        """Global rank 0, once a resume chose an older checkpoint: move the newer ones that failed
        verification to rejected/ (kept for inspection), so that retention, which keeps the newest
        step directories, never deletes a checkpoint that verified in favour of one that did not."""
        aside = self.directory / REJECTED_DIR
        for path, _ in self.rejected:
            make_dir(aside)
            target = aside / path.name
            if target.exists():
                _remove(target)
            os.replace(path, target)
            print(f"moved {path} aside to {target}: it failed verification (above)", flush=True)

    def check(self, path: Path) -> dict[str, Any]:
        """Collective: verify checkpoint `path` against its manifest and return the manifest.

        Every rank reads the manifest and checks its share of the files (`shares`): present, of
        the recorded size, with the recorded SHA-256 if `verify`, and DCP's metadata against the
        allow-list. Then all ranks agree: a failure anywhere raises CheckpointError on every rank.
        In one process, that process checks every file.
        """
        path = Path(path)
        failure, manifest = None, {}
        try:
            manifest = read_checkpoint_manifest(path)
            same_world = manifest["world"] == _world()
            if _rank() == 0:
                _check_complete(path, manifest)
            for name in shares(manifest["files"], _world(), same_world)[_rank()]:
                self._check_file(path, name, manifest["files"][name])
        except (CheckpointError, OSError) as err:  # OSError: a file this rank cannot read
            failure = str(err)
        _agree(failure)
        return manifest

    def _check_file(self, path: Path, name: str, expected: dict[str, Any]) -> None:
        problem = file_problem(path, name, expected, digest=self.verify)
        if problem is not None:
            raise CheckpointError(problem)
        if name == METADATA:  # checked even without `verify`: safety is never skipped
            file = path / name
            try:
                read_metadata(file)
            except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
                raise CheckpointError(f"unsafe or unreadable {file}: {err}") from err

    def load_sharded(self, path: Path, sharded: dict[str, Any]) -> None:
        """Fill `sharded` (this layout's state dict) in place from the checkpoint (collective),
        through the safe reader (safe_dcp.py): nothing in the checkpoint can run code."""
        with _single_process_quiet():
            safe_dcp.load(sharded, Path(path) / DCP_DIR, no_dist=not _distributed())

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
        raise CheckpointError(f"cannot load {file}: {refusal(err)}") from err


def read_checkpoint_manifest(path: Path) -> dict[str, Any]:
    """The manifest of checkpoint `path`, refused with CheckpointError unless it is well formed,
    of this hlat's format, and lists DCP's metadata."""
    file = path / MANIFEST
    try:
        manifest = atomic_files.read_manifest_json(file)
    except (OSError, ValueError) as err:  # ValueError: not UTF-8 or not JSON
        raise CheckpointError(f"unreadable {file}: {err}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        writer = manifest.get("hlat") if isinstance(manifest, dict) else None
        reader = f"hlat {writer}" if isinstance(writer, str) else "the hlat version that wrote it"
        raise CheckpointError(
            f"{file}: checkpoint format {found}, and hlat {__version__} reads format {FORMAT_VERSION}: {reader} "
            "reads it (to resume, or to `hlat export` its weights and start from them here with "
            "--checkpoint.init_from hf:DIR)"
        )
    files = manifest.get("files")
    well_formed = (
        isinstance(files, dict)
        and isinstance(manifest.get("world"), int)
        and all(
            isinstance(entry, dict)
            and isinstance(entry.get("bytes"), int)
            and isinstance(entry.get("sha256"), str)
            and _inside(name)
            for name, entry in files.items()
        )
    )
    if not well_formed:
        raise CheckpointError(
            f"{file} is malformed: it needs 'world' and 'files' mapping relative paths inside "
            "the checkpoint to their 'bytes' and 'sha256'"
        )
    if METADATA not in files:
        raise CheckpointError(f"{file} does not list {METADATA}")
    return manifest


def _check_complete(path: Path, manifest: dict[str, Any]) -> None:
    """Every file the checkpoint holds is in its manifest, and so is every file it needs: the
    shared file, DCP's metadata and each data file that metadata names, and a rank file for each
    rank that saved (or none, as in a weights-only archive). A file left out of the manifest would
    otherwise load unverified."""
    listed = set(manifest["files"])
    held = {str(f.relative_to(path)) for f in path.rglob("*") if f.is_symlink() or not f.is_dir()} - {MANIFEST}
    unlisted = sorted(held - listed)
    if unlisted:
        raise CheckpointError(f"{path} holds files its manifest does not list: {', '.join(unlisted[:8])}")
    ranks = {rank_file(r) for r in range(manifest["world"])}
    needed = {SHARED_FILE, METADATA} | (ranks if ranks & listed else set())
    try:
        metadata = read_metadata(path / METADATA)
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
        raise CheckpointError(f"unsafe or unreadable {path / METADATA}: {err}") from err
    needed |= {f"{DCP_DIR}/{info.relative_path}" for info in metadata.storage_data.values()}
    missing = sorted(needed - listed)
    if missing:
        raise CheckpointError(f"{path / MANIFEST} does not list {', '.join(missing[:8])}, which the checkpoint needs")


def _inside(name: str) -> bool:
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts


_OWNER = re.compile(r"rank_(\d+)\.pt|dcp/__(\d+)_\d+\.distcp")  # the files one rank writes (own_files)


def shares(files: dict[str, dict[str, Any]], world: int, same_world: bool) -> list[list[str]]:
    """Which manifest entries each of `world` ranks verifies. With the world size that saved the
    checkpoint, each rank takes the files its namesake wrote (the ones it reads back); every other
    file goes, largest first, to the rank with the fewest bytes so far."""
    owned: list[list[str]] = [[] for _ in range(world)]
    load = [0] * world
    rest = []
    for name, entry in files.items():
        match = _OWNER.fullmatch(name)
        owner = int(match.group(1) or match.group(2)) if match and same_world else world
        if owner < world:
            owned[owner].append(name)
            load[owner] += entry["bytes"]
        else:
            rest.append(name)
    for name in sorted(rest, key=lambda n: (-files[n]["bytes"], n)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owned[rank].append(name)
        load[rank] += files[name]["bytes"]
    return owned


def own_files(tmp: Path, rank: int) -> list[Path]:
    """The files one rank writes itself: its rank state, and the DCP data files that torch's
    FileSystemWriter names __<rank>_<n>.distcp. Anything else is hashed by rank 0."""
    return [tmp / rank_file(rank), *sorted((tmp / DCP_DIR).glob(f"__{rank}_*.distcp"))]


def _gather_hashes(
    tmp: Path, step: int, group: dist.ProcessGroup | None, failure: str | None = None
) -> dict[str, dict[str, Any]]:
    """Collective over `group`: every rank describes (size, SHA-256) the files it wrote, and
    every rank receives all of them (rank 0 writes them into the manifest). A failure on any
    rank (`failure`, or one while hashing) raises CheckpointError on every rank."""
    rank = _rank()
    files: dict[str, dict[str, Any]] = {}
    if failure is None:
        try:
            maybe_fail("hash", step, rank)
            files = {str(p.relative_to(tmp)): file_entry(p) for p in own_files(tmp, rank) if p.is_file()}
        except OSError as err:
            failure = f"failed to hash its files in {tmp}: {err!r}"
    gathered: list[Any] = [(files, failure)]
    if _distributed():
        gathered = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, (files, failure), group=group)
    _raise_any([f for _, f in gathered])
    return {name: entry for part, _ in gathered for name, entry in part.items()}


def _remove(path: Path) -> None:
    """Delete a directory of hlat's; a symbolic link in its place is removed itself, never followed."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def _save_synced(obj: Any, file: Path) -> None:
    # through a handle: given a path, torch.save would name the archive inside after the file
    with atomic_path(file) as temporary, open(temporary, "wb") as handle:
        torch.save(obj, handle)
