"""hlat train: train a model, resuming from the run directory's newest checkpoint."""

from __future__ import annotations

import argparse

from hlat.commands.common import OVERRIDES_HELP, add_config_args, load_run_config


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "train",
        allow_abbrev=False,
        help="train a model (auto-resumes from the run directory's newest checkpoint)",
        description="Train a model. With no arguments: the tiny preset on the embedded corpus (Python's "
        "standard library), on this machine, with no download. " + OVERRIDES_HELP,
        epilog="example: hlat train --preset small --train.steps 500 --optim.lr 1e-3",
    )
    add_config_args(parser)
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--resume", action="store_true", help="require a checkpoint to resume from (default: resume if one exists)"
    )
    group.add_argument(
        "--fresh",
        action="store_true",
        help="start over: delete this run directory's checkpoints, metrics and events first",
    )


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hlat.parallel.mesh import teardown, world_from_env
    from hlat.train.trainer import Trainer

    world, rank, _ = world_from_env()
    # the layout is validated here, on every rank alike, before any process group starts
    cfg = load_run_config(args, overrides, world=world)
    if rank == 0:
        for note in cfg.notes:
            print(note, flush=True)
    resume = "require" if args.resume else "fresh" if args.fresh else "auto"
    Trainer(cfg, resume=resume).fit()
    if world > 1:
        teardown()
    return 0
