"""hlat elastic-secret: create the secret that the replica groups of an elastic run share."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "elastic-secret",
        allow_abbrev=False,
        help="create the secret that the replica groups of an elastic run share",
        description="Write a new random secret (256 bits) to FILE, readable by you only. Give every group of the "
        "run the same file with --elastic.secret_file FILE (copy it to each node as you copy keys: readable by "
        "its owner only); docs/operations.md shows a launch.",
        epilog="example: hlat elastic-secret ~/.hlat/run.secret",
    )
    parser.add_argument("file", type=Path, help="the file to create (never replaced if it exists)")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hlat.train.elastic.secret import create_secret

    create_secret(args.file)
    print(
        f"wrote a new run secret to {args.file} (readable by you only); give every group --elastic.secret_file "
        f"{args.file}"
    )
    return 0
