"""Which isolation from the operating system the solution process gets on this machine.

"namespaces": `unshare` gives it new mount, network, PID, IPC and UTS namespaces (plus a user
namespace when hlat runs as a non-root user), sandbox_confine.py gives it a read-only root that
holds only the interpreter, its libraries and the scratch directory, and, when hlat runs as
root, an unprivileged uid of its own. "none": an ordinary subprocess with resource limits, a
scratch directory and a minimal environment, which can do whatever the user running hlat can;
running generated code then needs an explicit opt-in (`allow_unsafe` or HLAT_ALLOW_UNSAFE_CODE=1).
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import sysconfig

NAMESPACES, NONE = "namespaces", "none"
UID_BASE = 1_000_000_000  # each solution runs as its own uid above this one (process counts
UID_SPAN = 1 << 24  # and signals are per uid), never a uid of the system's users
UNSAFE_ENV = "HLAT_ALLOW_UNSAFE_CODE"


def unshare_command() -> list[str]:
    """The namespaces for one solution process; a user namespace only where hlat is not root
    (root may create the others directly, and then drops to an unprivileged uid itself)."""
    command = ["unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--propagation", "private"]
    if os.geteuid() != 0:
        command += ["--user", "--map-root-user"]
    return command + ["--"]


def solution_uid() -> int | None:
    """A fresh unprivileged uid for one solution when hlat runs as root, else None (a user
    namespace maps the caller, who is already unprivileged)."""
    return UID_BASE + secrets.randbelow(UID_SPAN) if os.geteuid() == 0 else None


def readable_paths() -> tuple[list[str], dict[str, str]]:
    """(directories the solution may read, symlinks to recreate): the interpreter's prefix (its
    binary, standard library and site-packages), site-packages outside it (a virtual
    environment), and the shared libraries; /lib and the like become links where they are."""
    paths = {sys.base_prefix, sys.prefix, *(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))}
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
