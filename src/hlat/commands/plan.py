"""hlat plan: per-rank memory of a layout at any world size, computed without allocating it, and on
a named accelerator its predicted step time, throughput, days and cost; --search ranks layouts."""

from __future__ import annotations

import argparse
import math

from hlat.commands.common import OVERRIDES_HELP, add_config_args, load_run_config


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "plan",
        allow_abbrev=False,
        help="dry run: per-rank memory, step time, tokens/s, days and cost of a layout",
        description="Build the model on the meta device under a fake process group of --world ranks and print, "
        "per pipeline stage, weight, gradient, optimizer-state and activation memory; with --device, the predicted "
        "step time (compute, exposed communication, pipeline bubble), tokens/s, MFU, days to the token budget and "
        "cost (docs/parallelism.md). " + OVERRIDES_HELP,
        epilog='examples: hlat plan --preset hlat-70b --world 4096 --device "H100 SXM"; '
        "hlat plan --preset hlat-7b --world 256 --device trn2 --search; hlat plan --hlat; hlat plan --calibration",
    )
    add_config_args(parser)
    parser.add_argument(
        "--world", type=int, help="number of ranks to plan for (GPUs; on Trainium logical NeuronCores) (required)"
    )
    parser.add_argument(
        "--device",
        help='an accelerator of hlat\'s table (e.g. "H100 SXM"; trn1, trn2, trn3: one rank per NeuronCore, on trn2 '
        'and trn3 per logical NeuronCore of 2, "trn2 LNC=1" for single cores), or cpu (this machine, as the '
        "trainer's MFU sees it): memory fit and throughput; `--device list` prints the table",
    )
    figures = parser.add_argument_group(
        "custom figures (replace the device's; without --device, --peak-tflops and --memory-gib are required)"
    )
    figures.add_argument("--peak-tflops", type=float, help="dense peak per rank in the run's compute dtype, TFLOP/s")
    figures.add_argument("--memory-gib", type=float, help="memory per rank, GiB")
    figures.add_argument(
        "--intra-gbs", type=float, help="one-way bandwidth per rank within a node, GB/s (0: not counted)"
    )
    figures.add_argument("--inter-gbs", type=float, help="one-way bandwidth per rank across nodes, GB/s")
    figures.add_argument("--per-node", type=int, help="ranks per node")
    figures.add_argument(
        "--efficiency",
        type=float,
        help="fraction of the peak compute reaches (default: the device "
        "family's calibrated constant, hlat plan --calibration)",
    )
    parser.add_argument(
        "--price-per-node-hour", type=float, help="cost of a node-hour (default: train.price_per_node_hour; 0: no cost)"
    )
    parser.add_argument("--tokens", type=float, help="token budget (default: train.steps x global batch x sequence)")
    parser.add_argument(
        "--search",
        action="store_true",
        help="rank every layout (tp, pp, ddp/zero1/zero2/fsdp/hsdp, "
        "micro-batch, recompute) that fits in memory by predicted tokens/s (needs --device)",
    )
    parser.add_argument("--top", type=int, default=10, help="layouts --search prints (default 10)")
    parser.add_argument(
        "--calibration",
        action="store_true",
        help="print the published runs the efficiency constants are fitted on, with fitted and held-out errors",
    )
    parser.add_argument(
        "--hlat",
        action="store_true",
        help="HLAT's 7B and 70B on 4096 trn1 chips (8192 NeuronCores) and on as many A100 "
        "40GB (p4d.24xlarge): days and cost per trillion tokens",
    )


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hlat.device.record import calibration_group_record
    from hlat.errors import UserError

    if args.device == "list":
        from hlat.accelerators import format_table

        print(format_table())
        return 0
    if args.calibration:
        from hlat.planning.calibration import format_calibration

        print(format_calibration())
        return 0
    if args.hlat:
        from hlat.planning.hlat_runs import format_hlat_runs

        print(format_hlat_runs(overrides))
        return 0
    if args.world is None:
        raise UserError("--world is required: the number of ranks to plan for, e.g. --world 64")
    _check_numbers(args)
    cfg = load_run_config(args, overrides, world=args.world)  # as hlat train on that many ranks
    # only now: the planner imports torch (seconds), which a config typo should not wait for
    from hlat.accelerators import by_table_name
    from hlat.config.data import AUTO_VIRTUAL_SHARDS, auto_virtual_shards
    from hlat.planning.forecast import Figures, format_forecast, make_system, nodes_of
    from hlat.planning.memory import format_fit, format_plan, largest_stage_gib, plan
    from hlat.planning.switches import format_switches, planned_layout
    from hlat.planning.throughput import step_time

    if args.device and args.device != "cpu":
        by_table_name(args.device)  # before the plan: a typo fails at once
    figures = Figures(args.peak_tflops, args.memory_gib, args.intra_gbs, args.inter_gbs, args.per_node, args.efficiency)
    system = make_system(args.device, figures, cfg, args.world)
    if args.search and system is None:
        raise UserError(
            "--search needs a device to rank layouts on: --device NAME (hlat plan --device list), "
            "--device cpu, or --peak-tflops and --memory-gib"
        )
    print("".join(note + "\n" for note in cfg.notes), end="")
    configured = cfg
    if system is not None:  # the layout training would run there (parallel.device_layout)
        cfg, layout_line = planned_layout(configured, args.world, system)
        if layout_line:
            print(f"{layout_line}; planned below")
    degrees, stages = plan(cfg, args.world)
    print(format_plan(cfg, args.world, degrees, stages))
    if not cfg.data.virtual_shards and (shards := auto_virtual_shards(degrees.dp)) != AUTO_VIRTUAL_SHARDS:
        print(f"data: {shards} virtual shards (auto for dp {degrees.dp}; training records them at its first start)")
    if system is None:
        return 0
    print(format_fit(stages, system))
    if degrees.tp > system.per_node:
        print(
            f"note: tp {degrees.tp} spans {degrees.tp // system.per_node} nodes of {system.per_node}: tensor "
            f"parallelism crosses the network; --parallel.tp {system.per_node} keeps it in a node"
        )
    if degrees.cp > 1 and not calibration_group_record(system.calibration_group).ring_attention:
        print(
            f"note: parallel.cp does not train on {system.calibration_group} yet (ring attention has no kernel there)"
        )
    fits = largest_stage_gib(stages) <= system.memory_gib
    if not fits and not args.search:
        print("this layout does NOT fit, so no time or cost is predicted: add --search to rank the layouts that do")
        return 0
    budget = args.tokens or cfg.train.steps * cfg.train.global_batch * cfg.data.seq_len
    price = cfg.train.price_per_node_hour if args.price_per_node_hour is None else args.price_per_node_hour
    own = step_time(cfg, args.world, system)
    if fits:
        print(format_forecast(own, system, args.world, budget, price))
    print(format_switches(configured, args.world, system))
    if args.search:
        from hlat.planning.layout_search import compare_with_own, format_search, search

        found = search(cfg, args.world, system)
        print(f"\nlayouts of {cfg.name} on {args.world} x {system.name} that fit, fastest first:")
        print(format_search(found, args.top, budget, price, nodes_of(system, args.world)))
        print(compare_with_own(found, own, fits))
    return 0


# flag -> (attribute, smallest value allowed, whether that value itself is allowed); a flag left out is not checked
_BOUNDS = {
    "--world": ("world", 1, True),
    "--peak-tflops": ("peak_tflops", 0.0, False),
    "--memory-gib": ("memory_gib", 0.0, False),
    "--intra-gbs": ("intra_gbs", 0.0, True),
    "--inter-gbs": ("inter_gbs", 0.0, True),
    "--per-node": ("per_node", 1, True),
    "--efficiency": ("efficiency", 0.0, False),
    "--price-per-node-hour": ("price_per_node_hour", 0.0, True),
    "--tokens": ("tokens", 0.0, False),
    "--top": ("top", 1, True),
}


def _check_numbers(args: argparse.Namespace) -> None:
    """Every numeric flag finite and in range, so a 0, a negative or a nan is named here rather than
    dividing by zero or printing nonsense days and costs further on."""
    from hlat.errors import UserError

    for flag, (name, low, inclusive) in _BOUNDS.items():
        value = getattr(args, name)
        if value is None:
            continue
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            raise UserError(f"{flag} must be a finite number {'>=' if inclusive else '>'} {low:g}, got {value}")
    if args.efficiency is not None and args.efficiency > 1:
        raise UserError(f"--efficiency is a fraction of the peak, in (0, 1], got {args.efficiency}")
