"""Evaluation throughput of hlat's harness against lm-evaluation-harness's Hugging Face backend,
on the same model (a preset, random weights, exported to HF format) and the same requests, in one
process: log-likelihood requests/s (multiple-choice shaped: 4 choices per question) and
generated tokens/s (greedy). Also prints the largest per-request log-likelihood difference.

    python benchmarks/eval_throughput.py --preset small --questions 64 --generations 8 --out benchmarks/eval_throughput.md
"""

from __future__ import annotations

import argparse
import datetime
import platform
import random
import sysconfig
import tempfile
import time
from pathlib import Path

import torch


def corpus_texts(n: int) -> list[str]:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
    return [f.read_text(errors="replace")[:4000] for f in files][:n]


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

    import tokenizers
    import transformers
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from hlat.config import load_config
    from hlat.data.tokenizer import Tokenizer
    from hlat.eval import GenerateRequest, LanguageModel, LoglikelihoodRequest, load_model
    from hlat.model import Llama
    from hlat.model.hf import hf_config_dict, hlat_to_hf

    cfg = load_config(args.preset).model
    texts = corpus_texts(200)
    tk = tokenizers.Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=cfg.vocab_size, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tmp = Path(tempfile.mkdtemp(prefix="hlat-evalbench-"))
    tk.save(str(tmp / "tokenizer.json"))
    torch.manual_seed(0)
    model = Llama(cfg)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_config_dict(cfg)))
    hf.load_state_dict(hlat_to_hf(model.state_dict()), strict=False)
    hf.save_pretrained(tmp)
    transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp / "tokenizer.json"),
                                         eos_token="<|endoftext|>").save_pretrained(tmp)

    rng = random.Random(0)
    pairs = []
    for _ in range(args.questions):
        text = rng.choice(texts)
        start = rng.randrange(0, max(1, len(text) - 600))
        ctx = text[start:start + rng.randrange(100, 500)]
        pairs += [(ctx, " " + rng.choice(texts)[:rng.randrange(5, 60)]) for _ in range(4)]
    prompts = [rng.choice(texts)[:300] for _ in range(args.generations)]

    loaded = load_model(tmp)
    ours = LanguageModel(loaded.model, loaded.tokenizer, args.device, args.batch_size,
                         prefix_token=loaded.prefix_token)
    theirs = HFLM(pretrained=str(tmp), dtype="float32", batch_size=args.batch_size, device=args.device)
    rows, lls = [], {}
    for name, run_ll, run_gen in (
        ("hlat", lambda: [x[0] for x in ours.loglikelihood([LoglikelihoodRequest(c, t) for c, t in pairs])],
         lambda: ours.generate([GenerateRequest(p, (), args.gen_tokens) for p in prompts])),
        ("lm-eval hf", lambda: [x[0] for x in theirs.loglikelihood(
            [Instance("loglikelihood", {}, (c, t), i) for i, (c, t) in enumerate(pairs)])],
         lambda: theirs.generate_until([Instance("generate_until", {}, (p, {"until": [], "max_gen_toks": args.gen_tokens, "do_sample": False}), i) for i, p in enumerate(prompts)])),
    ):
        t0 = time.perf_counter()
        lls[name] = run_ll()
        ll_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        outs = run_gen()
        gen_s = time.perf_counter() - t0
        n_tokens = sum(len(loaded.tokenizer.encode(o)) for o in outs)
        rows.append(f"| {name} | {len(pairs) / ll_s:,.1f} | {n_tokens / gen_s:,.1f} |")
    diff = max(abs(a - b) for a, b in zip(lls["hlat"], lls["lm-eval hf"]))
    table = "\n".join(["| harness | log-likelihood requests/s | generated tokens/s |", "|---|---|---|", *rows])
    header = (f"{args.preset} preset, {len(pairs)} log-likelihood requests, {len(prompts)} x "
              f"{args.gen_tokens} greedy tokens, batch {args.batch_size}, {args.device}; "
              f"max |log-likelihood difference| = {diff:.2e}")
    print(header + "\n\n" + table)
    if args.out:
        args.out.write_text(f"# Evaluation throughput\n\n{datetime.date.today()}, {platform.processor() or platform.machine()}, "
                            f"torch {torch.__version__}, transformers {transformers.__version__}\n\n{header}\n\n{table}\n")


if __name__ == "__main__":
    main()
