"""Runs first inside the sandbox's child process (passed as `python -c`), then runs the program.

It sets the resource limits and installs an audit hook (PEP 578) that refuses, from then on:
sockets, starting processes, ctypes (which could call libc around the hook), raising resource
limits, and any write, create, delete or rename outside the temporary directory. The program
passes only if it runs to its end: the harness checks for a token that arrives on stdin and that
the program never sees, so a program calling os._exit(0) early still fails.

argv: root, program file, memory limit (MiB), CPU seconds, file size limit (MiB).
"""

import os
import resource
import sys

ROOT = os.path.realpath(sys.argv[1])
PROGRAM = os.path.join(ROOT, sys.argv[2])
MIB = 1 << 20
for limit, value in ((resource.RLIMIT_AS, int(sys.argv[3]) * MIB),
                     (resource.RLIMIT_CPU, int(sys.argv[4])),
                     (resource.RLIMIT_FSIZE, int(sys.argv[5]) * MIB),
                     (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(limit, (value, value))
TOKEN = sys.stdin.readline().strip()
sys.stdin.close()
del sys.argv[1:]

DENIED_PREFIXES = ("socket.", "ctypes.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn",
                   "os.fork", "os.system", "os.kill", "pty.", "resource.setrlimit", "resource.prlimit")
PATH_EVENTS = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1,
               "os.truncate": 1, "os.utime": 1, "shutil.rmtree": 1, "os.rename": 2, "os.link": 2,
               "os.symlink": 2, "shutil.copyfile": 2, "shutil.copytree": 2, "shutil.move": 2}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _inside(path):
    if isinstance(path, int):  # an already open descriptor: it was checked when opened
        return True
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return real == ROOT or real.startswith(ROOT + os.sep)


def _hook(event, args):
    if event.startswith(DENIED_PREFIXES):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open":
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & WRITE_FLAGS)
        if writes and not _inside(path):
            raise PermissionError(f"sandbox: writing {path} outside the sandbox directory")
    elif event in PATH_EVENTS:
        for path in args[:PATH_EVENTS[event]]:
            if not _inside(path):
                raise PermissionError(f"sandbox: {event} on {path} outside the sandbox directory")


os.chdir(ROOT)
with open(PROGRAM, encoding="utf-8") as handle:
    CODE = compile(handle.read(), PROGRAM, "exec")
sys.addaudithook(_hook)
exec(CODE, {"__name__": "__main__", "__file__": PROGRAM, "__builtins__": __builtins__})
sys.stdout.write("\n" + TOKEN + "\n")
sys.stdout.flush()
