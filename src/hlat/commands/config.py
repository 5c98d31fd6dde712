"""hlat config / hlat presets: show the resolved configuration or what a field means, list the presets."""

from __future__ import annotations

import argparse

from hlat.commands.common import OVERRIDES_HELP, add_config_args, load_run_config


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "config",
        allow_abbrev=False,
        help="print the resolved configuration as TOML, or what a field means",
        description="Print the resolved configuration (presets, file and overrides applied). " + OVERRIDES_HELP,
    )
    add_config_args(parser)
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument(
        "--explain",
        metavar="FIELD",
        help="print what section.field means: its type, allowed values, default "
        "and, with --preset/--config/overrides, its value there; a section's name lists its fields",
    )
    shown.add_argument(
        "--reference",
        action="store_true",
        help="print the reference of every field as Markdown (docs/configuration.md)",
    )
    sub.add_parser("presets", help="list the preset names")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hlat.config.load import preset_names
    from hlat.config.reference import explain, reference_page

    if args.command == "presets":
        print("\n".join(preset_names()))
    elif args.reference:
        print(reference_page(), end="")
    elif args.explain:
        resolved = args.preset or args.config or overrides
        source = ", ".join(
            [
                *([f"preset {args.preset}"] if args.preset else []),
                *([args.config] if args.config else []),
                *(["overrides"] if overrides else []),
            ]
        )
        cfg = load_run_config(args, overrides) if resolved else None
        print(explain(args.explain, cfg, source), end="")
    else:
        print(load_run_config(args, overrides).to_toml(), end="")
    return 0
