"""hlat params: parameter count and training FLOPs per token of a configuration."""

from __future__ import annotations

import argparse

from hlat.commands.common import OVERRIDES_HELP, load_run_config


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "params",
        allow_abbrev=False,
        help="parameter count and training FLOPs per token of a preset",
        description="Print parameter count and training FLOPs per token. " + OVERRIDES_HELP,
    )
    parser.add_argument("preset", nargs="?", help="preset name (default: tiny)")
    parser.add_argument("--config", metavar="FILE", help="TOML file applied over the preset")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    cfg = load_run_config(args, overrides)
    from hlat.model import count_params, flops_per_token, model_spec  # torch: after the config's checks

    n = count_params(cfg.model)
    flops = flops_per_token(cfg.model, cfg.data.seq_len)
    embedding = cfg.model.vocab_size * cfg.model.d_model
    print(
        f"{cfg.name}: {n:,} parameters ({n / 1e9:.2f}B), "
        + (
            "its embedding matrix also the output head"
            if cfg.model.tie_embeddings
            else f"{n - embedding:,} without the input embedding"
        )
    )
    print(
        f"training FLOPs per token at seq_len {cfg.data.seq_len}: {flops:.4g} ({model_spec(cfg.model).flops_formula})"
    )
    return 0
