"""hlat lighthouse: torchft's lighthouse for an elastic run (elastic.enabled), until interrupted."""

from __future__ import annotations

import argparse
import signal
import threading

MAX_MS = 7 * 24 * 3600 * 1000  # a week: torchft takes an unsigned 64-bit count; anything longer is a typo


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "lighthouse",
        allow_abbrev=False,
        help="run the lighthouse that the replica groups of an elastic run meet at",
        description="Run torchft's lighthouse (the `elastic` extra) in this process until Ctrl-C or SIGTERM. "
        "Each replica group's `hlat train --elastic.enabled true --elastic.lighthouse ADDRESS` finds the "
        "others through it; docs/operations.md shows a launch.",
        epilog="example: hlat lighthouse --port 29510 --min-groups 2",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; give this node's address on the "
        "cluster network when groups run on other nodes; docs/operations.md)",
    )
    parser.add_argument("--port", type=int, default=29510, help="port to listen on (default 29510; 0 = any free one)")
    parser.add_argument("--min-groups", type=int, default=1, help="groups a quorum needs (default 1)")
    parser.add_argument(
        "--join-timeout-ms",
        type=int,
        default=1000,
        help="how long a quorum waits for more groups to join (default 1000)",
    )
    parser.add_argument(
        "--heartbeat-timeout-ms",
        type=int,
        default=5000,
        help="silence after which a group counts as lost (default 5000)",
    )


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hlat.errors import UserError
    from hlat.train.elastic.replicas import import_torchft

    if args.min_groups < 1:
        raise UserError(f"--min-groups {args.min_groups}: a quorum needs at least 1 group")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: give a TCP port, 0 to 65535 (0 = any free one)")
    for flag, value in (
        ("--join-timeout-ms", args.join_timeout_ms),
        ("--heartbeat-timeout-ms", args.heartbeat_timeout_ms),
    ):
        if not 0 < value <= MAX_MS:
            raise UserError(f"{flag} {value}: give milliseconds, 1 to {MAX_MS:,}")
    import_torchft()
    from torchft.coordination import LighthouseServer

    try:
        server = LighthouseServer(
            bind=f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}",
            min_replicas=args.min_groups,
            join_timeout_ms=args.join_timeout_ms,
            heartbeat_timeout_ms=args.heartbeat_timeout_ms,
        )
    except RuntimeError as err:
        raise UserError(
            f"--host {args.host} --port {args.port}: cannot start the lighthouse ({err}); choose a free port and an "
            "address of this machine"
        ) from None
    print(f"lighthouse listening at {server.address()} (min {args.min_groups} group(s)); Ctrl-C stops it", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.shutdown()
    return 0
