"""Arguments shared by the subcommands that take a run configuration."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hlat.config.run import RunConfig

OVERRIDES_HELP = (
    "Any config field can be overridden as --section.field VALUE or --section.field=VALUE, "
    "e.g. --optim.lr 1e-4 --train.steps 50 --precision.mode fp32 (`hlat config` prints every field)."
)


def add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", help="preset name (default: tiny); `hlat presets` lists them")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file of [section] tables, applied over --preset or its own top-level preset = NAME",
    )


def load_run_config(args: argparse.Namespace, overrides: list[str], world: int | None = None) -> RunConfig:
    """The run configuration of --preset, --config and the overrides, checked as `hlat train` checks
    it (task names included: the registry lives above the configuration package)."""
    from hlat.config.load import load_config
    from hlat.eval.tasks import task_name_problems

    return load_config(args.preset, args.config, overrides, world=world, checks=(task_name_problems,))
