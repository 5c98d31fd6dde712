"""Confining the solution process from the operating system, before the solution runs.

Called as root inside fresh mount, network, PID, IPC and UTS namespaces (made by `unshare`, see
sandbox_isolation.py): builds a new root on a small tmpfs that holds only read-only bind mounts
of the interpreter, its standard library, site-packages and shared libraries, /dev/null, zero,
random and urandom, and a scratch directory of its own (a tmpfs of a fixed size at /sandbox,
holding a copy of solution.py: what the solution writes fills it, never the host's disk); makes it the root
(pivot_root, the old root detached); then drops to an unprivileged uid and gid with no groups,
no capabilities and no_new_privs.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}  # syscall numbers; glibc has no wrapper
DEVICES = ("null", "zero", "random", "urandom")
SCRATCH = "/sandbox"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sandbox: {what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    args = [None if s is None else os.fsencode(s) for s in (source, target, fstype)]
    _check(_libc.mount(*args, flags, None if data is None else data.encode()), f"mount {source} on {target}")


def _bind(source: str, target: str, flags: int) -> None:
    """Bind source (a directory or a file) at target, then apply flags (a bind mount takes
    MS_RDONLY etc. only on a remount). Flags the source mount already has are kept: a remount
    may not clear them."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(source, target, None, MS_BIND)
    kept = os.statvfs(source).f_flag & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | flags | kept)


SCRATCH_INODES = 4096  # files and directories the solution may create


def confine(
    root: str, scratch: str, readable: list[str], links: dict[str, str], uid: int | None, scratch_mb: int
) -> None:
    """Make `root` (an empty directory) the root of this mount namespace, holding `readable`
    read-only at their own paths, `links` (path -> symlink target, e.g. /lib -> usr/lib), the
    devices and a `scratch_mb` tmpfs at /sandbox with `scratch`/solution.py; then drop to `uid`
    (None: stay, e.g. inside a user namespace where the caller is already unprivileged outside)."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for path in readable:
        _bind(path, root + path, MS_RDONLY | MS_NOSUID | MS_NODEV)
    for path, target in links.items():
        os.symlink(target, root + path)
    for name in DEVICES:
        _bind(f"/dev/{name}", f"{root}/dev/{name}", MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    os.makedirs(root + SCRATCH)
    owner = "" if uid is None else f",uid={uid},gid={uid}"
    _mount(
        "tmpfs",
        root + SCRATCH,
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={scratch_mb}m,nr_inodes={SCRATCH_INODES},mode=700{owner}",
    )
    with (
        open(os.path.join(scratch, "solution.py"), "rb") as source,
        open(root + SCRATCH + "/solution.py", "wb") as copy,
    ):
        copy.write(source.read())
    if uid is not None:
        os.chown(root + SCRATCH + "/solution.py", uid, uid)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    number = PIVOT_ROOT.get(platform.machine())
    if number is not None and _libc.syscall(number, b".", b".") == 0:
        _check(_libc.umount2(b".", MNT_DETACH), "detaching the old root")
    else:  # an unknown architecture: chroot, which holds as long as no capability is left
        os.chroot(".")
    os.chdir(SCRATCH)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # from root to non-zero: every capability is dropped
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
