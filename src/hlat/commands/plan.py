"""hlat plan: per-rank memory of a layout at any world size, computed without allocating it."""

from __future__ import annotations

import argparse

from hlat.commands.common import OVERRIDES_HELP, add_config_args


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "plan", allow_abbrev=False, help="dry run: per-rank memory of a layout (no real memory, no devices)",
        description="Build the model on the meta device under a fake process group of --world ranks and print, "
        "per pipeline stage, weight, gradient, optimizer-state and activation memory. " + OVERRIDES_HELP,
        epilog="example: hlat plan --preset hlat-70b --world 4096 --device \"H100 SXM\"",
    )
    add_config_args(parser)
    parser.add_argument("--world", type=int, help="number of ranks (accelerators) to plan for (required)")
    parser.add_argument("--device", help="an accelerator of hlat's table (e.g. \"H100 SXM\"): show whether each rank's memory "
                        "fits in its memory; `--device list` prints the table")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hlat.config import load_config
    from hlat.devices import by_table_name, format_table
    from hlat.errors import UserError
    from hlat.parallel.plan import format_fit, format_plan, plan

    if args.device == "list":
        print(format_table())
        return 0
    if args.world is None:
        raise UserError("--world is required: the number of ranks to plan for, e.g. --world 64")
    device = by_table_name(args.device) if args.device else None  # before the plan: a typo fails at once
    cfg = load_config(args.preset, args.config, overrides, world=args.world)  # as hlat train on that many ranks
    print("".join(note + "\n" for note in cfg.notes), end="")
    degrees, stages = plan(cfg, args.world)
    print(format_plan(cfg, args.world, degrees, stages))
    if device:
        print(format_fit(stages, device))
    return 0
