"""The sockets an elastic group listens on, each bound to one address of this machine
(elastic.bind_address, else the address it reaches the lighthouse from), never every interface:
a group's store and state server carry what a run's groups exchange. torchft 0.2.0's manager
server binds `[::]` itself, with no option to narrow it: the group names its port at start-up."""

from __future__ import annotations

import socket

import torch

from hlat.errors import UserError


def listening_socket(host: str) -> socket.socket:
    """A TCP socket listening on `host` at a port the system chooses."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(128)
    except OSError as err:
        sock.close()
        raise UserError(
            f"elastic.bind_address={host}: cannot listen there ({err.strerror or err}); give an address of this machine"
        ) from None
    return sock


def bound_store(host: str) -> torch.distributed.TCPStore:
    """A group's own TCPStore (a group of one plain process), listening on `host` only (on its own
    a TCPStore listens on every interface)."""
    listener = listening_socket(host)
    port = listener.getsockname()[1]
    return torch.distributed.TCPStore(
        host, port, is_master=True, wait_for_workers=False, master_listen_fd=listener.detach()
    )


def manager_server_port(store_host: str, store_port: int) -> int:
    """The port of torchft's manager server for this group, as torchft publishes it in the group's store."""
    from torchft.manager import MANAGER_ADDR_KEY

    store = torch.distributed.TCPStore(store_host, store_port, is_master=False, wait_for_workers=False)
    return int(store.get(MANAGER_ADDR_KEY).decode().rsplit(":", 1)[1])  # http://HOST:PORT


def manager_server_line(port: int, host: str) -> str:
    """The start-up line naming torchft's manager server, which listens on every interface, and its firewall rule."""
    return (
        f"elastic: torchft's manager server listens on every interface at TCP port {port} (torchft 0.2.0 cannot "
        f"bind it to {host}); let only the run's machines reach it, e.g. `iptables -A INPUT -p tcp --dport {port} "
        "! -s RUN_NETWORK -j DROP` (docs/operations.md, trust model)"
    )
