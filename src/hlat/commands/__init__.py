"""One module per `hlat` subcommand: each defines `register(subparsers)` and `run(args, overrides)`."""
