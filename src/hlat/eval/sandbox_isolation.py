"""Which isolation from the operating system the sandbox's processes get on this machine.

Both get the same one: the solution process (generated code) and the test process (a task
file's test code). "namespaces": `unshare` gives each new mount, network, PID, IPC and UTS
namespaces (plus a user namespace when hlat runs as a non-root user), sandbox_confine.py a
read-only root that holds only what it needs to read and a scratch directory, and, when hlat
runs as root, an unprivileged uid of its own. "none": ordinary subprocesses with resource
limits and a minimal environment, which can do whatever the user running hlat can; running
code tasks then needs an explicit opt-in (`allow_unsafe` or HLAT_ALLOW_UNSAFE_CODE=1).
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import sysconfig

NAMESPACES, NONE = "namespaces", "none"
UID_BASE = 1_000_000_000  # each sandbox process runs as its own uid above this one (process counts
UID_SPAN = 1 << 24  # and signals are per uid), never a uid of the system's users
UNSAFE_ENV = "HLAT_ALLOW_UNSAFE_CODE"


def unshare_command() -> list[str]:
    """The namespaces for one sandbox process; a user namespace only where hlat is not root
    (root may create the others directly, and then drops to an unprivileged uid itself)."""
    command = ["unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--propagation", "private"]
    if os.geteuid() != 0:
        command += ["--user", "--map-root-user"]
    return command + ["--"]


def sandbox_uid() -> int | None:
    """A fresh unprivileged uid for one sandbox process when hlat runs as root, else None (a
    user namespace maps the caller, who is already unprivileged)."""
    return UID_BASE + secrets.randbelow(UID_SPAN) if os.geteuid() == 0 else None


def readable_paths(packages: bool = True) -> tuple[list[str], dict[str, str]]:
    """(directories a sandbox process may read, symlinks to recreate), /lib and the like becoming
    links where they are. With `packages` (the solution): the interpreter's prefix (its binary,
    standard library and site-packages), site-packages outside it (a virtual environment) and
    the shared libraries. Without (the test process, whose imports are all done but the test's
    own): the standard library, its extension modules and the shared libraries."""
    if packages:
        paths = {sys.base_prefix, sys.prefix, *(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))}
    else:  # the base interpreter's, not a virtual environment's (its lib/pythonX.Y holds site-packages)
        base = {"base": sys.base_prefix, "platbase": sys.base_prefix}
        paths = {sysconfig.get_path(k, vars=base) for k in ("stdlib", "platstdlib")}
    links = {}
    for lib in ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib"):
        if os.path.islink(lib):
            links[lib] = os.readlink(lib)
        elif os.path.isdir(lib):
            paths.add(lib)
    real = sorted({os.path.normpath(p) for p in paths if os.path.isdir(p)})  # as sys.path names them
    # keep only outermost directories: a bind mount of a parent already shows its children
    outer = [p for p in real if not any(p.startswith(q + os.sep) for q in real if q != p)]
    return outer, links


def site_packages() -> list[str]:
    return sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})


def unsafe_code_allowed(allow_unsafe: bool) -> bool:
    return allow_unsafe or os.environ.get(UNSAFE_ENV, "") == "1"


def unshare_available() -> bool:
    return shutil.which("unshare") is not None
