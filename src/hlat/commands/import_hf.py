"""hlat import: a local Hugging Face LLaMA directory as an hlat run directory (`import` is a keyword)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "import",
        allow_abbrev=False,
        help="turn a Hugging Face LLaMA directory into an hlat run directory",
        description="Read a local Hugging Face LLaMA directory (config.json; model.safetensors, sharded "
        "safetensors with their index, or pytorch_model.bin; tokenizer.json or tokenizer.model) and write an "
        "hlat run directory: config.toml with the architecture, the tokenizer, and a weights-only checkpoint. "
        "hlat eval, hlat export and --checkpoint.init_from read it; config.toml also holds settings to continue "
        "pre-training (a short schedule, validation on held-out documents). Tied embeddings, RoPE scaling (linear, "
        "llama3), head_dim and attention/MLP biases are imported. What hlat cannot represent (another RoPE type or "
        "activation, Qwen3's sliding window) is refused, naming the config.json field.",
        epilog="example: hlat import ~/models/llama-2-7b runs/llama-2-7b && hlat eval --checkpoint runs/llama-2-7b --tasks arc_easy",
    )
    parser.add_argument("source", type=Path, help="Hugging Face model directory (save_pretrained's output)")
    parser.add_argument("run_dir", type=Path, help="run directory to create (must be new or empty)")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json or .model (default: the one in SOURCE)")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hlat.checkpoint.hf_import import CONTINUED, continued_seq_len, import_hf

    done = import_hf(args.source, args.run_dir, args.tokenizer, progress=sys.stderr.isatty())  # refusals: hlat.cli
    cfg, run_dir = done.model, done.run_dir
    print(
        f"imported {args.source} into {run_dir}\n"
        f"  model: {done.params / 1e6:,.1f}M parameters, d_model {cfg.d_model}, {cfg.n_layers} layers, "
        f"{cfg.n_heads} heads ({cfg.n_kv_heads} key/value), vocab {cfg.vocab_size}\n"
        f"  weights: {done.checkpoint} (float32; source dtype {done.source_dtype})\n"
        f"  tokenizer: {done.tokenizer}\n"
        f"next:\n"
        f"  hlat eval --checkpoint {run_dir} --tasks arc_easy\n"
        f"  hlat export {run_dir} OUT_DIR\n"
        f"  hlat train --config {run_dir / 'config.toml'} --data.source YOUR_DATA   # continue pre-training "
        f"from these weights (new optimizer; {CONTINUED['train.steps']} steps of {CONTINUED['train.global_batch']} x "
        f"{continued_seq_len(cfg)} tokens, validation every {CONTINUED['eval.every']}: "
        "see that file)"
    )
    return 0
