"""The TCP sockets a process listens on, read from /proc (Linux): the tests that check that
nothing of an elastic run listens on every interface."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

LISTEN = "0A"  # the state column of /proc/net/tcp*


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` listens on; "0.0.0.0" or "::" is every interface."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == LISTEN and inode in inodes:
                address, port = local.rsplit(":", 1)
                found.append((_address(address), int(port, 16)))
    return found


def _address(hex_address: str) -> str:
    """/proc/net/tcp* writes an address as 32-bit words, each in the host's (little-endian) byte order."""
    words = [bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, len(hex_address), 8)]
    return str(ipaddress.ip_address(b"".join(words)))
