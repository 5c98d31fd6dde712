"""One module per `hlat` subcommand: each defines `register(subparsers)` and `run(args, overrides)`;
common holds their shared arguments and preflight the checks `hlat doctor` runs."""
