"""hlat export: an hlat checkpoint or run directory as a Hugging Face LLaMA directory."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "export",
        allow_abbrev=False,
        help="write a Hugging Face LLaMA directory (safetensors, config.json, tokenizer)",
        description="Export the weights of an hlat checkpoint (saved in any parallel layout), weights-only archive, "
        "or run directory (its newest checkpoint) for transformers' LlamaForCausalLM.from_pretrained. "
        "The reverse is hlat train --checkpoint.init_from hf:DIR.",
        epilog="example: hlat export runs/small hf/small && python -c \"import transformers as t; t.AutoModelForCausalLM.from_pretrained('hf/small')\"",
    )
    parser.add_argument("source", type=Path, help="run directory, checkpoints/step_N or archive/step_N")
    parser.add_argument("out", type=Path, help="output directory: new or empty (created), see --overwrite")
    parser.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier export in OUT (only the files an export writes; any other file refuses)",
    )
    parser.add_argument("--shard-gb", type=float, default=5.0, help="largest safetensors file, GiB (default 5)")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hlat.checkpoint.hf_export import export_hf

    done = export_hf(args.source, args.out, int(args.shard_gb * 2**30), args.dtype, args.overwrite)
    step = f"step {done.step:,}" if done.step is not None else "a checkpoint without a step"
    print(f"exported {step} ({done.checkpoint}) of {args.source} to {done.out} (Hugging Face {done.architecture})")
    return 0
