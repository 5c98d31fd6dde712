"""hlat lighthouse: torchft's lighthouse for an elastic run (elastic.enabled), until interrupted."""

from __future__ import annotations

import argparse
import signal
import threading


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
    import_torchft()
    from torchft.coordination import LighthouseServer

    try:
        server = LighthouseServer(
            bind=f"[::]:{args.port}",
            min_replicas=args.min_groups,
            join_timeout_ms=args.join_timeout_ms,
            heartbeat_timeout_ms=args.heartbeat_timeout_ms,
        )
    except RuntimeError as err:
        raise UserError(f"--port {args.port}: cannot start the lighthouse ({err}); choose a free port") from None
    print(f"lighthouse listening at {server.address()} (min {args.min_groups} group(s)); Ctrl-C stops it", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.shutdown()
    return 0
