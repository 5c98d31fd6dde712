"""The `hlat` command: train, params, config and presets."""

from __future__ import annotations

import argparse
import sys

from hlat.errors import ConfigError

OVERRIDES_HELP = (
    "Any config field can be overridden as --section.field VALUE or --section.field=VALUE, "
    "e.g. --optim.lr 1e-4 --train.steps 50 --precision.mode fp32. Sections: model, data, optim, "
    "schedule, train, precision, checkpoint (`hlat config` prints them all)."
)


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", help="preset name (default: tiny); `hlat presets` lists them")
    parser.add_argument("--config", metavar="FILE", help="TOML file of [section] tables, applied over --preset or its own top-level preset = NAME")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hlat", allow_abbrev=False,
        description="Pre-train LLaMA models with the HLAT recipe. `hlat train` alone trains the tiny preset "
        "on the embedded corpus (Python's standard library) on this machine's CPU, with no download.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    train = sub.add_parser(
        "train", allow_abbrev=False, help="train a model (auto-resumes from the run directory's newest checkpoint)",
        description="Train a model. " + OVERRIDES_HELP, epilog="example: hlat train --preset small --train.steps 500",
    )
    _add_config_args(train)
    group = train.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="require a checkpoint to resume from (default: resume if one exists)")
    group.add_argument("--fresh", action="store_true", help="start over: delete this run directory's checkpoints, metrics and events first")

    params = sub.add_parser("params", allow_abbrev=False, help="parameter count and training FLOPs per token of a preset",
                            description="Print parameter count and training FLOPs per token. " + OVERRIDES_HELP)
    params.add_argument("preset", nargs="?", help="preset name (default: tiny)")
    params.add_argument("--config", metavar="FILE", help="TOML file applied over the preset")

    config = sub.add_parser("config", allow_abbrev=False, help="print the resolved configuration as TOML",
                            description="Print the resolved configuration. " + OVERRIDES_HELP)
    _add_config_args(config)

    sub.add_parser("presets", help="list the preset names")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, overrides = parser.parse_known_args(argv)
    try:
        return _run(args, overrides)
    except ConfigError as err:
        print(f"hlat {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the newest checkpoint is intact; run the same command to resume", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hlat.config import load_config, preset_names

    if args.command == "presets":
        print("\n".join(preset_names()))
        return 0
    cfg = load_config(args.preset, args.config, overrides)
    if args.command == "config":
        print(cfg.to_toml(), end="")
    elif args.command == "params":
        from hlat.model import count_params, flops_per_token

        n = count_params(cfg.model)
        flops = flops_per_token(cfg.model, cfg.data.seq_len)
        print(f"{cfg.name}: {n:,} parameters ({n / 1e9:.2f}B), {n - cfg.model.vocab_size * cfg.model.d_model:,} without the input embedding")
        print(f"training FLOPs per token at seq_len {cfg.data.seq_len}: {flops:.4g} (6N + 12·L·d·T)")
    elif args.command == "train":
        from hlat.train.trainer import Trainer

        resume = "require" if args.resume else "fresh" if args.fresh else "auto"
        Trainer(cfg, resume=resume).fit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
