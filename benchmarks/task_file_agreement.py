"""hlat against lm-evaluation-harness on larger local task files: one per output type and two
few-shot ones, written in lm-eval's YAML and read by both (hlat: `hlat eval --task-file`'s loader;
lm-eval: simple_evaluate on that folder only). Same model (a preset with random weights and a
byte-level BPE trained on the standard library, exported to a local Hugging Face directory: no
network), fp32, CPU. Prints per task: examples, the largest per-example log-likelihood difference,
how many per-example decisions (acc, acc_norm, exact_match, generated text) differ, both
harnesses' aggregate metric, and the seconds each took. `--out FILE` writes the markdown report.

    python benchmarks/task_file_agreement.py --preset tiny --questions 200 --out benchmarks/task_file_agreement.md

The tests (tests/eval/test_lm_eval_agreement.py) do the same on a few examples per task.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import platform
import random
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from eval_throughput import corpus_texts, export_model  # noqa: E402

DATA = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {test}\n{train}test_split: test\n"
SHOTS = "    train: {train}\nfewshot_split: train\nnum_fewshot: 3\nfewshot_config:\n  sampler: first_n\n"
MC = """output_type: multiple_choice
doc_to_text: "Docstring: {{doc}}\\nFunction:"
doc_to_target: answer
doc_to_choice: "{{choices}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""
GEN = """output_type: generate_until
doc_to_text: "{{prompt}}"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 16
metric_list:
  - metric: exact_match
"""
OUTPUT_TYPES = {
    "mc": "multiple_choice",
    "ll": "loglikelihood",
    "rolling": "loglikelihood_rolling",
    "gen": "generate_until",
}
TASKS = {  # name: (YAML body, few-shot); the name's first part is its OUTPUT_TYPES key
    "mc": (MC, False),
    "mc_3shot": ('description: "Name the function each docstring describes.\\n\\n"\n' + MC, True),
    "ll": (
        """output_type: loglikelihood
doc_to_text: "{{context}}"
doc_to_target: "{{continuation}}"
metric_list:
  - metric: perplexity
  - metric: acc
""",
        False,
    ),
    "rolling": (
        """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
""",
        False,
    ),
    "gen": (GEN, False),
    "gen_3shot": (GEN, True),
}


def documented_functions(texts: list[str]) -> list[tuple[str, str]]:
    """(name, first docstring line) of the standard library's documented top-level functions."""
    found = {}
    for text in texts:
        try:
            tree = ast.parse(text)
        except SyntaxError:  # a file cut at 4,000 characters
            continue
        for node in tree.body:
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            if doc and doc.strip() and not node.name.startswith("_"):
                found.setdefault(node.name, doc.strip().splitlines()[0][:120])
    return sorted(found.items())


def rows_by_task(texts: list[str], questions: int) -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(0)
    functions = documented_functions(corpus_texts(10_000))
    names = [n for n, _ in functions]
    mc = []
    for name, doc in rng.sample(functions, min(questions, len(functions))):
        choices = [name, *rng.sample([n for n in names if n != name], 3)]
        rng.shuffle(choices)
        mc.append({"doc": doc, "choices": choices, "answer": choices.index(name)})
    ll, gen = [], []
    long_texts = [t for t in texts if len(t) > 1000]
    for _ in range(questions):
        text = rng.choice(long_texts)
        start = rng.randrange(0, len(text) - 400)
        cut = text.find(" ", start + rng.randrange(100, 300))  # at a space: no token straddles the cut
        ll.append({"context": text[start:cut], "continuation": text[cut : cut + rng.randrange(5, 60)]})
    for text in rng.sample(texts, min(questions // 4, len(texts))):
        line = text.splitlines()[0] if text.strip() else "import os"
        gen.append({"prompt": text[:200], "answer": line})
    rolling = [{"text": t[: rng.randrange(500, 2500)]} for t in rng.sample(texts, min(questions // 10, len(texts)))]
    return {"mc": mc, "mc_3shot": mc, "ll": ll, "rolling": rolling, "gen": gen, "gen_3shot": gen}


def write_tasks(folder: Path, rows: dict[str, list[dict[str, Any]]]) -> None:
    folder.mkdir(parents=True)
    for name, (body, shots) in TASKS.items():
        files = {}
        for split, data in (("test", rows[name][3:] if shots else rows[name]), ("train", rows[name][:3])):
            files[split] = folder / f"{name}.{split}.jsonl"
            files[split].write_text("".join(json.dumps(r) + "\n" for r in data))
        train = SHOTS.format(train=files["train"]) if shots else ""
        (folder / f"{name}.yaml").write_text(f"task: {name}\n" + DATA.format(test=files["test"], train=train) + body)


def per_example(kind: str, sample: dict[str, Any], mine: dict[str, Any]) -> tuple[float, bool]:
    """(|log-likelihood difference|, whether the per-example decision differs) of one example."""
    if kind == "mc":
        theirs = [float(r[0][0]) for r in sample["resps"]]
        diff = max(abs(a - b) for a, b in zip(theirs, mine["loglikelihoods"]))
        return diff, (mine["acc"], mine["acc_norm"]) != (sample["acc"], sample["acc_norm"])
    if kind == "ll":
        ll, greedy = sample["resps"][0][0]
        return abs(float(ll) - mine["loglikelihood"]), bool(greedy) != mine["greedy"]
    if kind == "rolling":
        return abs(float(sample["resps"][0][0]) - mine["loglikelihood"]), False
    return 0.0, mine["output"] != sample["resps"][0][0] or mine["exact_match"] != sample["exact_match"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import lm_eval
    from lm_eval.tasks import TaskManager

    from hlat.checkpoint.loading import load_model
    from hlat.eval import EvalOptions, LanguageModel, evaluate_task
    from hlat.eval.tasks.task_file import load_task_files

    with tempfile.TemporaryDirectory(prefix="hlat-agreement-") as tmp:
        texts = corpus_texts(200)
        n_params = export_model(args.preset, texts, Path(tmp))
        rows = rows_by_task(texts, args.questions)
        write_tasks(Path(tmp) / "tasks", rows)
        start = time.perf_counter()
        theirs = lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={tmp},dtype=float32",
            tasks=list(TASKS),
            task_manager=TaskManager(include_path=str(Path(tmp) / "tasks"), include_defaults=False),
            num_fewshot=None,
            batch_size=args.batch_size,
            device="cpu",
            log_samples=True,
        )
        their_s = time.perf_counter() - start
        loaded = load_model(Path(tmp))
        lm = LanguageModel(
            loaded.model,
            loaded.tokenizer,
            batch_size=args.batch_size,
            prefix_token=loaded.prefix_token,
            progress=False,
            bos=loaded.bos,
        )
        lines = [
            "| task | output type | examples | max \\|Δ log-likelihood\\| | decisions that differ | hlat | lm-eval |",
            "|---|---|---:|---:|---:|---|---|",
        ]
        start = time.perf_counter()
        for task in load_task_files([Path(tmp) / "tasks"]):
            ours = evaluate_task(lm, task, EvalOptions())
            samples = sorted(theirs["samples"][task.name], key=lambda s: s["doc_id"])
            kind = task.name.split("_")[0]
            diffs = [per_example(kind, s, m) for s, m in zip(samples, ours.samples)]
            metric = next(iter(ours.metrics))
            mine_value, their_value = ours.metrics[metric]["value"], theirs["results"][task.name][f"{metric},none"]
            lines.append(
                f"| {task.name} | {OUTPUT_TYPES[kind]} | {len(ours.samples)} ({len(samples)} in lm-eval) | "
                f"{max(d for d, _ in diffs):.1e} | {sum(b for _, b in diffs)} | "
                f"{metric} {mine_value:.6g} | {their_value:.6g} |"
            )
            print(lines[-1], flush=True)
        our_s = time.perf_counter() - start
    header = [
        "# Task files: hlat against lm-evaluation-harness on larger local tasks",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- versions: Python {platform.python_version()}, torch {torch.__version__}, lm-eval {version('lm_eval')}, "
        f"transformers {version('transformers')}",
        f"- model: `{args.preset}` preset ({n_params / 1e6:.1f}M parameters, random weights), fp32, CPU, batch "
        f"{args.batch_size}; a byte-level BPE trained on the standard library",
        f"- tasks: built from the standard library (`python benchmarks/task_file_agreement.py --preset {args.preset} "
        f"--questions {args.questions}`); 3-shot tasks take their shots from a train split with "
        "`fewshot_config: {sampler: first_n}`",
        f"- time: lm-eval {their_s:.0f} s, hlat {our_s:.0f} s (all tasks, model loading excluded for hlat)",
        "",
    ]
    report = "\n".join(header + lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
