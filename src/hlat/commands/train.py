"""hlat train: train a model, resuming from the run directory's newest checkpoint."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from hlat.commands.common import OVERRIDES_HELP, add_config_args, load_run_config

if TYPE_CHECKING:
    from hlat.config.run import RunConfig


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
    from hlat.parallel.world import world_from_env

    world, rank, _ = world_from_env()
    # the layout is validated here, on every rank alike, before any process group starts; and
    # before torch is imported (seconds), so that a typo costs well under one
    cfg = load_run_config(args, overrides, world=world)
    from hlat.parallel.mesh import teardown
    from hlat.train.trainer import Trainer

    if rank == 0:
        for note in [*cfg.notes, *filter(None, [no_data_warning(cfg)])]:
            print(note, flush=True)
    resume = "require" if args.resume else "fresh" if args.fresh else "auto"
    Trainer(cfg, resume=resume).fit()
    if world > 1:
        teardown()
    return 0


def no_data_warning(cfg: RunConfig) -> str | None:
    """Without data.source a run trains on the embedded corpus (a few MB of Python): what the tiny
    preset's model is for; any other model (a preset's, an imported one) almost surely meant the
    user's data."""
    from hlat.config.load import DEFAULT_PRESET, load_config
    from hlat.model import count_params

    if cfg.data.source or cfg.model == load_config(DEFAULT_PRESET).model:
        return None
    return (
        f"warning: no data.source: this {count_params(cfg.model) / 1e6:,.1f}M-parameter model trains on the "
        "embedded corpus (Python's standard library, meant for trying hlat out with the tiny preset); give "
        "your data with --data.source FILE, DIRECTORY or hf:NAME (docs/data.md)"
    )
