"""Evaluation throughput of hlat's harness against lm-evaluation-harness's Hugging Face backend,
on the same model (a preset, random weights, exported to HF format in a temporary directory: no
network) and the same requests, in one process: log-likelihood requests/s (multiple-choice
shaped: 4 choices per question) and generated tokens/s (greedy). Also prints the largest
per-request log-likelihood difference between the two.

Both get the same requests, batch size, maximum length (the preset's) and fp32 weights, and one
untimed warm-up batch each; each harness sorts and batches its requests its own way. Generated
tokens are counted the same way for both: each output re-encoded by the same tokenizer.

    python benchmarks/eval_throughput.py --preset small --questions 64 --generations 8 --out benchmarks/eval_throughput.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import torch

Pair = tuple[str, str]  # (context, continuation)
Runner = tuple[Callable[[list[Pair]], list[float]], Callable[[list[str], int], list[str]]]


def corpus_texts(n: int) -> list[str]:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
    return [f.read_text(errors="replace")[:4000] for f in files][:n]


def export_model(preset: str, texts: list[str], directory: Path) -> int:
    """A random-weight model of `preset` and a byte-level BPE trained on `texts`, saved as a
    Hugging Face directory; returns the parameter count."""
    import tokenizers
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from hlat.config.load import load_config
    from hlat.model import Llama
    from hlat.model.hf import hf_config_dict, hlat_to_hf

    cfg = load_config(preset).model
    tk = tokenizers.Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=cfg.vocab_size,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tk.save(str(directory / "tokenizer.json"))
    torch.manual_seed(0)
    model = Llama(cfg)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_config_dict(cfg)))
    hf.load_state_dict(hlat_to_hf(model.state_dict()))  # strict: every weight is the same
    hf.save_pretrained(directory)
    transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(directory / "tokenizer.json"), eos_token="<|endoftext|>"
    ).save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def hlat_runner(directory: Path, device: str, batch_size: int) -> Runner:
    from hlat.checkpoint.loading import load_model
    from hlat.eval import GenerateRequest, LanguageModel, LoglikelihoodRequest

    loaded = load_model(directory)
    lm = LanguageModel(loaded.model, loaded.tokenizer, device, batch_size, prefix_token=loaded.prefix_token)
    return (
        lambda pairs: [ll for ll, _ in lm.loglikelihood([LoglikelihoodRequest(c, t) for c, t in pairs])],
        lambda prompts, n: lm.generate([GenerateRequest(p, (), n) for p in prompts]),
    )


def lm_eval_runner(directory: Path, device: str, batch_size: int) -> Runner:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=str(directory), dtype="float32", batch_size=batch_size, device=device)

    def loglikelihood(pairs: list[Pair]) -> list[float]:
        return [
            ll for ll, _ in lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)])
        ]

    def generate(prompts: list[str], n: int) -> list[str]:
        # `until` empty: lm-eval stops at the EOS text, as hlat stops at the EOS token.
        settings = {"until": [], "max_gen_toks": n, "do_sample": False}
        return lm.generate_until([Instance("generate_until", {}, (p, settings), i) for i, p in enumerate(prompts)])

    return loglikelihood, generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--gen-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hlat-evalbench-") as tmp:
        run(args, Path(tmp))


def run(args: argparse.Namespace, directory: Path) -> None:
    from hlat.data.tokenizer import Tokenizer

    texts = corpus_texts(200)
    n_params = export_model(args.preset, texts, directory)
    tokenizer = Tokenizer.from_file(directory / "tokenizer.json")

    rng = random.Random(0)
    pairs: list[Pair] = []
    for _ in range(args.questions):
        text = rng.choice(texts)
        start = rng.randrange(0, max(1, len(text) - 600))
        ctx = text[start : start + rng.randrange(100, 500)]
        pairs += [(ctx, " " + rng.choice(texts)[: rng.randrange(5, 60)]) for _ in range(4)]
    prompts = [rng.choice(texts)[:300] for _ in range(args.generations)]

    load_before = os.getloadavg()[0]
    rows, lls, speeds = [], {}, {}
    for name, build in (("hlat", hlat_runner), ("lm-eval hf", lm_eval_runner)):
        loglikelihood, generate = build(directory, args.device, args.batch_size)
        loglikelihood(pairs[: args.batch_size])  # warm-up: first-call costs stay out of the timing
        generate(prompts[:1], 2)
        t0 = time.perf_counter()
        lls[name] = loglikelihood(pairs)
        ll_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        outputs = generate(prompts, args.gen_tokens)
        gen_s = time.perf_counter() - t0
        n_tokens = sum(len(tokenizer.encode(o)) for o in outputs)
        speeds[name] = (len(pairs) / ll_s, n_tokens / gen_s)
        rows.append(
            f"| {name} | {ll_s:.1f} | {speeds[name][0]:,.1f} | {gen_s:.1f} | {n_tokens} | {speeds[name][1]:,.1f} |"
        )
    ratios = [ours / theirs for ours, theirs in zip(speeds["hlat"], speeds["lm-eval hf"])]
    rows.append(f"| hlat / lm-eval | | {ratios[0]:.2f}x | | | {ratios[1]:.2f}x |")
    diff = max(abs(a - b) for a, b in zip(lls["hlat"], lls["lm-eval hf"]))
    table = "\n".join(
        [
            "| harness | log-likelihood s | requests/s | generation s | tokens | tokens/s |",
            "|---|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )
    header = (
        f"{args.preset} preset ({n_params / 1e6:.1f}M parameters), {len(pairs)} log-likelihood requests, "
        f"{len(prompts)} x {args.gen_tokens} greedy tokens, batch {args.batch_size}, {args.device}, fp32, "
        f"{torch.get_num_threads()} threads; max |log-likelihood difference| = {diff:.2e}; "
        f"1-minute load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(header + "\n\n" + table)
    if args.out:
        import transformers

        now = datetime.datetime.now(datetime.UTC)
        args.out.write_text(
            f"# Evaluation throughput (benchmarks/eval_throughput.py)\n\n## Run ({now:%Y-%m-%d, %H:%M} UTC)\n"
            f"{platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, transformers "
            f"{transformers.__version__}, lm-eval {version('lm_eval')}. Command: `python {' '.join(sys.argv)}`.\n\n"
            f"{header}\n\n{table}\n"
        )


if __name__ == "__main__":
    main()
