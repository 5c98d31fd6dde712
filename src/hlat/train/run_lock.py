"""One trainer per run directory: an advisory lock that the process writing it holds.

Global rank 0 takes `fcntl.flock` on `<run_dir>/.hlat-lock` before it reads or writes anything
there, writes its host and pid into the file, and holds it until the run ends (fit returns or
raises; a start that fails releases it at once). A second trainer on the same directory is
refused with one line naming the holder. The kernel drops the lock when its holder dies, even by
kill -9, so a stale file never blocks: only a live holder does. Readers (hlat eval, export,
generate) take no lock: checkpoints appear by atomic rename, so they read whole ones.

The file is removed on release while still locked; a taker checks after locking that the path
still names the file it locked (else it lost a race with a release, and retries), so two
processes can never both believe they hold it. Someone deleting or replacing the file while the
run holds it lets a second trainer in; the holder finds out at its next checkpoint (`check`: the
path no longer names the file it locked) and stops before writing, and a release removes the file
only while it is still its own. Where the file system cannot lock (flock: ENOLCK, EOPNOTSUPP, as
on some network mounts) the run says so in one line and goes on unguarded.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from collections.abc import Callable
from pathlib import Path

from hlat.atomic_files import SymlinkRefused
from hlat.errors import UserError

LOCK_FILE = ".hlat-lock"


class RunDirLocked(UserError):
    """Another live process is training into this run directory."""


class RunDirLock:
    """Held from `acquire` until `release` (idempotent)."""

    def __init__(self, path: Path, fd: int, created_dir: Path | None):
        self.path, self._fd, self._created_dir = path, fd, created_dir

    @classmethod
    def acquire(cls, run_dir: Path, out: Callable[[str], None] = print) -> RunDirLock:
        """Lock `run_dir` (created if missing, and removed again on release if it is then empty),
        or raise RunDirLocked naming the holder."""
        run_dir = Path(run_dir)
        created = None
        if not run_dir.exists():
            run_dir.mkdir(parents=True)
            created = run_dir
        path = run_dir / LOCK_FILE
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise SymlinkRefused(f"refusing to follow the symbolic link {path}; remove it") from err
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd) or "another process"
                os.close(fd)
                raise RunDirLocked(
                    f"{run_dir} is in use by the run of {holder} (lock {path}); wait for it to end, stop it, "
                    "or train into another --train.run_dir"
                ) from None
            except OSError as err:
                if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP):
                    raise
                out(
                    f"warning: the file system of {run_dir} cannot lock files ({os.strerror(err.errno)}): nothing "
                    "stops a second trainer from using this run directory at the same time; make sure none does"
                )
            if _names(path, fd):
                break
            os.close(fd)  # its holder released and removed it between our open and our lock
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"host {socket.gethostname()} pid {os.getpid()}\n".encode(), 0)
        return cls(path, fd, created)

    def check(self) -> None:
        """Raise RunDirLocked unless the lock file is still the one this run locked."""
        if self._fd >= 0 and not _names(self.path, self._fd):
            raise RunDirLocked(
                f"{self.path} is no longer this run's lock (deleted or replaced while it trained: another trainer "
                f"may be using {self.path.parent}); stopped before writing a checkpoint: make sure only one trainer "
                "uses this run directory, then run the same command to resume from the last checkpoint"
            )

    def release(self) -> None:
        if self._fd < 0:
            return
        if _names(self.path, self._fd):
            self.path.unlink(missing_ok=True)  # while still locked: see the module docstring
        os.close(self._fd)
        self._fd = -1
        if self._created_dir is not None:
            try:
                self._created_dir.rmdir()  # a start that failed leaves no directory behind
            except OSError:
                pass  # not empty: the run wrote there

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)


def _names(path: Path, fd: int) -> bool:
    """Whether `path` still names the open file `fd` (the same inode on the same device)."""
    try:
        here = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (here.st_ino, here.st_dev) == (held.st_ino, held.st_dev)


def _read(fd: int) -> str:
    return os.pread(fd, 200, 0).decode(errors="replace").strip()
