"""The `hlat` command. Each subcommand lives in hlat.commands.<module>; this file only dispatches."""

from __future__ import annotations

import argparse
import importlib
import sys

from hlat.errors import ConfigError

# subcommand name -> module in hlat.commands (one module may register several names)
COMMANDS = {"train": "train", "eval": "eval", "params": "params", "config": "config", "presets": "config", "plan": "plan", "prepare": "prepare", "tokenizer": "tokenizer", "export": "export", "import": "import_hf", "doctor": "doctor"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hlat", allow_abbrev=False,
        description="Pre-train LLaMA models with the HLAT recipe. `hlat train` alone trains the tiny preset "
        "on the embedded corpus (Python's standard library) on this machine's CPU, with no download.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in dict.fromkeys(COMMANDS.values()):
        importlib.import_module(f"hlat.commands.{module}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args, overrides = build_parser().parse_known_args(argv)
    try:
        return importlib.import_module(f"hlat.commands.{COMMANDS[args.command]}").run(args, overrides)
    except ConfigError as err:
        print(f"hlat {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the newest checkpoint is intact; run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
