"""The `hlat` command. Each subcommand lives in hlat.commands.<module>; this file only dispatches
and turns expected failures into one line.

An expected failure (hlat.errors.UserError: a bad argument, an invalid configuration, a bad data
row, a corrupt or incomplete checkpoint, a refused Hugging Face directory; or a missing file),
raised anywhere, prints `hlat COMMAND: MESSAGE` on stderr and exits with code 2; so does an
argument argparse refuses, and an unknown `--x` given to a command that takes no config overrides.
HLAT_DEBUG=1 (or --debug) prints the traceback too. An interrupt (Ctrl-C, SIGTERM) prints one line, exit
code 128 + the signal: `hlat train` says where a resume starts. Under torchrun, an error raised before the
process group started is the same on every rank, so rank 0 alone prints it; one raised later may
be a single rank's, so each rank that meets it prints it, naming itself.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import signal
import sys
import time
import traceback
from typing import NoReturn

from hlat.errors import UserError

# subcommand name -> module in hlat.commands (one module may register several names)
COMMANDS = {
    "train": "train",
    "eval": "eval",
    "params": "params",
    "config": "config",
    "presets": "config",
    "plan": "plan",
    "prepare": "prepare",
    "tokenizer": "tokenizer",
    "export": "export",
    "import": "import_hf",
    "doctor": "doctor",
    "generate": "generate",
    "lighthouse": "lighthouse",
    "elastic-secret": "elastic_secret",
}
# the commands whose unknown `--x` arguments are config overrides; the others refuse them
TAKES_OVERRIDES = {"train", "config", "params", "plan", "prepare", "doctor"}
EXPECTED = (UserError, FileNotFoundError)  # what the user can fix from the message alone
USER_ERROR_EXIT = 2
DEBUG_ENV = "HLAT_DEBUG"
QUIET_RANK_DELAY_S = 1.0  # see _report


class ArgumentsRefused(UserError):
    """A command line argparse refuses; `prog` is the command it concerns ("hlat train", "hlat")."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """argparse's errors as ArgumentsRefused (subcommands' parsers are of this class too), so that
    they are reported like every other expected error rather than by argparse's usage + exit."""

    def error(self, message: str) -> NoReturn:
        raise ArgumentsRefused(self.prog, f"{message}; see {self.prog} --help")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hlat",
        allow_abbrev=False,
        description="Pre-train LLaMA models with the HLAT recipe. `hlat train` alone trains the tiny preset "
        "on the embedded corpus (Python's standard library) on this machine's CPU, with no download.",
    )
    debug_help = f"on an expected error, print the traceback too (same as {DEBUG_ENV}=1)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in dict.fromkeys(COMMANDS.values()):
        importlib.import_module(f"hlat.commands.{module}").register(sub)
    for command in sub.choices.values():  # `hlat train --debug` as well as `hlat --debug train`
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    return parser


def main(argv: list[str] | None = None) -> int:
    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    parser = build_parser()
    try:
        args, overrides = parser.parse_known_args(argv)
    except ArgumentsRefused as err:
        return _report(err.prog, err, debug)
    prog = f"hlat {args.command}"
    try:
        # a config override names a section.field: an undotted --x close to a flag is that flag mistyped
        close = _close_flags(overrides, _flags(parser, args.command))
        refused = overrides if args.command not in TAKES_OVERRIDES else [a for a in overrides if a in close]
        if refused:
            hints = "".join(f"; {arg.split('=', 1)[0]}: did you mean {close[arg]}?" for arg in refused if arg in close)
            raise ArgumentsRefused(prog, f"unrecognized arguments: {' '.join(refused)}{hints}; see {prog} --help")
        return importlib.import_module(f"hlat.commands.{COMMANDS[args.command]}").run(args, overrides)
    except EXPECTED as err:
        return _report(prog, err, debug=args.debug or debug)
    except KeyboardInterrupt as err:
        return _interrupted(prog, err)


def _flags(parser: argparse.ArgumentParser, command: str) -> list[str]:
    """The --flags of subcommand `command`."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [flag for action in sub.choices[command]._actions for flag in action.option_strings if flag[:2] == "--"]


def _close_flags(unknown: list[str], flags: list[str]) -> dict[str, str]:
    """{argument: the flag of `flags` it is closest to} for each unknown --x or --x=VALUE whose
    name is close to one (difflib's ratio of at least 0.6, without the dashes every flag shares);
    a --section.field is not a flag."""
    names = {flag[2:]: flag for flag in flags}
    close = {}
    for arg in unknown:
        name = arg.split("=", 1)[0]
        found = difflib.get_close_matches(name[2:], names, n=1) if name.startswith("--") and "." not in name else []
        if found:
            close[arg] = names[found[0]]
    return close


def _report(prog: str, err: BaseException, debug: bool) -> int:
    rank = int(os.environ.get("RANK", "0"))
    group_started = _process_group_started()
    if rank == 0 or group_started:
        if debug:
            traceback.print_exc()
        where = f" (rank {rank})" if rank and group_started else ""
        print(f"{prog}{where}: {err}", file=sys.stderr, flush=True)
    code = getattr(err, "exit_code", USER_ERROR_EXIT)  # a failure a launcher tells apart (hlat.train.replay: 3)
    if group_started:
        # Leave without interpreter teardown, as a finished multi-process run does: gloo's
        # threads can race it and turn this exit code into SIGABRT.
        sys.stdout.flush()
        os._exit(code)
    if rank:  # the launcher stops every rank once one exits: let rank 0 print the error first
        time.sleep(QUIET_RANK_DELAY_S)
    return code


def _interrupted(prog: str, err: KeyboardInterrupt) -> int:
    """Ctrl-C or SIGTERM: `hlat train` says where a resume starts (hlat.train.interrupt), the others
    only that they stopped; rank 0 prints it (training's ranks agree on it). Exit 128 + the signal."""
    code = 128 + getattr(err, "signum", signal.SIGINT)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{prog}: {str(err) or 'interrupted'}", file=sys.stderr, flush=True)
    if _process_group_started():  # as in _report
        sys.stdout.flush()
        os._exit(code)
    return code


def _process_group_started() -> bool:
    dist = sys.modules.get("torch.distributed")  # never imported by commands that need no torch
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def entry() -> NoReturn:
    """The `hlat` program (console script and `python -m hlat`). A finished multi-process run leaves
    without interpreter teardown: gloo's worker threads can race it and abort the run (SIGABRT after
    all work is done), which a launcher would count as a failure. (An error leaves through _report;
    one found before any group started exits normally, which leaves rank 0 the time to print it
    before the launcher stops the others.) main() itself returns, so it can run inside another
    program's process."""
    code = main()
    if code == 0 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
