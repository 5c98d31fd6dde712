"""hlat generate: continue a prompt with a trained model, streaming the tokens as they come."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from hlat.device.names import DEVICE_HELP
from hlat.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "generate",
        allow_abbrev=False,
        help="continue a prompt with a checkpoint or model (KV cache, streamed)",
        description="Continue --prompt with an hlat run directory (its newest checkpoint), one "
        "step_NNNNNNNN/ checkpoint, or a local Hugging Face LLaMA directory. Greedy by default; "
        "--temperature > 0 samples (with --top-p and --seed).",
        epilog='example: hlat generate --checkpoint runs/tiny --prompt "def main(" --max-new-tokens 32',
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        metavar="PATH",
        help="run directory, step_NNNNNNNN/ directory, or Hugging Face model directory",
    )
    parser.add_argument("--prompt", required=True, help="the text to continue (may be empty)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="at most this many tokens (default 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    parser.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="sample from the smallest set of tokens whose probability reaches P (0 < P <= 1; default 1 = all)",
    )
    parser.add_argument("--seed", type=int, default=0, help="sampling seed: the same seed, the same text")
    parser.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="stop before this text (repeatable)"
    )
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json (default: the model's own)")
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.add_argument(
        "--precision", default="fp32", choices=("fp32", "mixed"), help="mixed = bf16 autocast (weights stay fp32)"
    )


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    _check(args)

    from hlat.checkpoint.loading import load_model
    from hlat.device.resolve import resolve_device
    from hlat.eval import GenerateRequest, LanguageModel
    from hlat.eval.stream import TextStream

    device = resolve_device(args.device, "--device")
    try:
        loaded = load_model(args.checkpoint, args.tokenizer)
    except ValueError as err:  # an unreadable run config or a refused Hugging Face directory
        raise UserError(str(err)) from err
    lm = LanguageModel(
        loaded.model,
        loaded.tokenizer,
        device,
        batch_size=1,
        precision=args.precision,
        prefix_token=loaded.prefix_token,
        seed=args.seed,
        progress=False,
        bos=loaded.bos,
    )
    request = GenerateRequest(args.prompt, tuple(args.stop), args.max_new_tokens, args.temperature, args.top_p)
    stream = TextStream(request.until)
    print(args.prompt, end="", flush=True)
    start = time.perf_counter()
    (text,) = lm.generate([request], stream)
    seconds = time.perf_counter() - start
    stream.finish(text)
    print(
        f"\n[{loaded.name} on {device}: {stream.tokens} tokens in {seconds:.2f} s, "
        f"{stream.tokens / seconds:.1f} tokens/s]",
        flush=True,
    )
    return 0


def _check(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise UserError(f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")
    if any(not stop for stop in args.stop):
        raise UserError("--stop must not be empty text")
    if not Path(args.checkpoint).expanduser().exists():
        raise UserError(
            f"--checkpoint {args.checkpoint}: no such file or directory; pass a run directory "
            "(e.g. runs/tiny), a step_NNNNNNNN/ checkpoint or a Hugging Face model directory"
        )
