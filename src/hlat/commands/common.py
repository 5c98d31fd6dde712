"""Arguments shared by the subcommands that take a run configuration."""

from __future__ import annotations

import argparse

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
