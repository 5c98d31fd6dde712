"""hlat config / hlat presets: show the resolved configuration, list the presets."""

from __future__ import annotations

import argparse

from hlat.commands.common import OVERRIDES_HELP, add_config_args


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("config", allow_abbrev=False, help="print the resolved configuration as TOML",
                            description="Print the resolved configuration (presets, file and overrides applied). " + OVERRIDES_HELP)
    add_config_args(parser)
    sub.add_parser("presets", help="list the preset names")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hlat.config.load import load_config, preset_names

    if args.command == "presets":
        print("\n".join(preset_names()))
    else:
        print(load_config(args.preset, args.config, overrides).to_toml(), end="")
    return 0
