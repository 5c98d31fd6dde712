"""Confining a sandbox process from the operating system before any code it was given runs.

Both processes of a program go through `enter`: the solution process S (the generated code) and
the test process T (the dataset's test code, which comes from a file a user downloaded: data,
not something to run on the host either). Isolated, each was started by `unshare` in fresh mount,
network, PID, IPC and UTS namespaces (sandbox_isolation.py) and forks the first process of its
PID namespace; that process builds a new root on a small tmpfs holding only read-only bind
mounts of what it may read (S: the interpreter, its standard library, site-packages and shared
libraries; T: the standard library and shared libraries), /dev/null, zero, random and urandom,
and a scratch directory of its own (a tmpfs of a fixed size at /sandbox, holding copies of the
files it was given: what it writes fills it, never the host's disk); makes it the root
(pivot_root, the old root detached); then drops to an unprivileged uid and gid with no groups,
no capabilities and no_new_privs. The parent stays behind as its keeper. Resource limits apply
in both modes.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import select
import signal
from typing import Any, NoReturn

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}  # syscall numbers; glibc has no wrapper
DEVICES = ("null", "zero", "random", "urandom")
SCRATCH = "/sandbox"
MIB = 1 << 20

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


SCRATCH_INODES = 4096  # files and directories the process may create


def enter(isolation: dict[str, Any] | None, limits: dict[str, int], channel: tuple[int, ...]) -> None:
    """Confine this process as `isolation` says (None: mode "none", an ordinary subprocess), then
    apply `limits`. Isolated, it returns in the forked first process of the PID namespace; this
    process stays behind as the keeper and never returns."""
    if isolation is not None:
        child = os.fork()
        if child:
            _keep(child, channel)
        confine(
            isolation["root"],
            isolation["files"],
            isolation["readable"],
            isolation["links"],
            isolation["uid"],
            isolation["scratch_mb"],
        )
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    _limit(limits)


def _keep(child: int, channel: tuple[int, ...]) -> NoReturn:
    """The keeper: holds nothing of the channel and ends with the child's exit status (T's is the
    verdict), or kills the child once the harness lets go (closes our stdin, or dies); the kernel
    then kills everything left in the namespace."""
    for fd in channel:
        os.close(fd)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the harness stops us by closing stdin
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)  # SIGCHLD writes here, so the select below returns
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    while True:
        done, status = os.waitpid(child, os.WNOHANG)  # also an exit before the handler was set
        if done:
            break
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        if 0 in ready and not os.read(0, 4096):
            os.kill(child, signal.SIGKILL)  # not reaped yet, so the pid cannot have been reused
            _, status = os.waitpid(child, 0)
            break
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)  # killed by signal N: 128 + N, as a shell says


def _limit(limits: dict[str, int]) -> None:
    for limit, value in (
        (resource.RLIMIT_AS, limits["memory_mb"] * MIB),
        (resource.RLIMIT_CPU, limits["cpu_s"]),
        (resource.RLIMIT_FSIZE, limits["file_mb"] * MIB),
        (resource.RLIMIT_NPROC, limits["processes"]),
        (resource.RLIMIT_NOFILE, 256),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))


def confine(
    root: str, files: list[str], readable: list[str], links: dict[str, str], uid: int | None, scratch_mb: int
) -> None:
    """Make `root` (an empty directory) the root of this mount namespace, holding `readable`
    read-only at their own paths, `links` (path -> symlink target, e.g. /lib -> usr/lib), the
    devices and a `scratch_mb` tmpfs at /sandbox with copies of `files`; then drop to `uid`
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
    for path in files:
        copy = f"{root}{SCRATCH}/{os.path.basename(path)}"
        with open(path, "rb") as source, open(copy, "wb") as target:
            target.write(source.read())
        if uid is not None:
            os.chown(copy, uid, uid)
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
