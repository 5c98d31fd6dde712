"""hlat eval: the HLAT benchmark suite on an hlat checkpoint, a run directory, or a HF model."""

from __future__ import annotations

import argparse
from pathlib import Path

from hlat.device.names import DEVICE_HELP
from hlat.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "eval",
        allow_abbrev=False,
        help="evaluate a checkpoint on the HLAT benchmark suite",
        description="Evaluate an hlat checkpoint (step_NNNNNNNN/), every checkpoint of a run "
        "directory (plotting each metric against tokens seen), or a local Hugging Face LLaMA "
        "directory. Task data comes from --data-dir (jsonl/json/parquet/arrow, see "
        "docs/evaluation.md), else the Hugging Face hub; HumanEval works offline. Your own "
        "tasks: --task-file with lm-evaluation-harness task YAML.",
        epilog="example: hlat eval --checkpoint runs/tiny --tasks arc_easy,humaneval --data-dir data/eval",
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        metavar="PATH",
        help="step_NNNNNNNN/ directory, run directory, or Hugging Face model directory",
    )
    parser.add_argument("--tasks", help="comma-separated task names (see --list)")
    parser.add_argument("--suite", help="a named suite: hlat (the paper's table), commonsense, code")
    parser.add_argument(
        "--task-file",
        type=Path,
        action="append",
        default=[],
        metavar="YAML",
        help="an lm-evaluation-harness task YAML file, or a folder of them "
        "(repeatable; the supported keys are in docs/evaluation.md)",
    )
    parser.add_argument("--list", action="store_true", help="list tasks and suites, then exit")
    parser.add_argument("--data-dir", type=Path, help="local task files: <dir>/<task>/<split>.jsonl")
    parser.add_argument("--output", type=Path, help="results folder (default: <checkpoint>/eval)")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json (default: the model's own)")
    parser.add_argument("--limit", type=int, help="evaluate only the first N examples of each task")
    parser.add_argument("--num-fewshot", type=int, help="override every task's number of shots")
    parser.add_argument("--seed", type=int, default=1234, help="few-shot selection and sampling seed")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.add_argument(
        "--precision", default="fp32", choices=("fp32", "mixed"), help="mixed = bf16 autocast (weights stay fp32)"
    )
    parser.add_argument("--samples", type=int, default=1, help="code: completions per problem (pass@k)")
    parser.add_argument("--temperature", type=float, default=0.0, help="code: sampling temperature")
    parser.add_argument("--timeout", type=float, default=10.0, help="code: seconds per program")
    parser.add_argument(
        "--allow-unsafe-code",
        action="store_true",
        help="code: run generated programs even where no isolation is available "
        "(only inside a throwaway container or VM; also HLAT_ALLOW_UNSAFE_CODE=1)",
    )
    parser.add_argument("--baseline", type=Path, help="JSON of reported scores to print alongside")
    parser.add_argument("--latest", action="store_true", help="run directory: only the newest checkpoint")
    parser.add_argument("--log-samples", action="store_true", help="write samples_<task>.jsonl")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hlat.eval import SUITES, TASKS

    if args.list:
        for task in TASKS.values():
            print(
                f"{task.name:14s} {task.category:18s} {task.kind:16s} {task.num_fewshot}-shot  {', '.join(task.metrics)}"
            )
        for name, members in SUITES.items():
            print(f"suite {name}: {', '.join(members)}")
        return 0
    try:
        return _evaluate(args)
    except UserError:
        raise
    except (ValueError, ImportError) as err:  # bad task names, task data or model files; a missing package
        raise UserError(str(err)) from err


def _evaluate(args: argparse.Namespace) -> int:
    from hlat.atomic_files import refuse_symlink
    from hlat.checkpoint.loading import LoadedModel, is_run_dir, load_model
    from hlat.device.resolve import resolve_device
    from hlat.eval import EvalOptions, LanguageModel, SandboxLimits, evaluate, resolve_tasks
    from hlat.eval.results import load_baselines, markdown_table, results_dict, write_results
    from hlat.eval.sandbox import isolation_summary, require_isolation
    from hlat.eval.sweep import sweep_run, write_sweep
    from hlat.eval.tasks.task_file import load_task_files

    if args.output is not None and args.output.exists() and not args.output.is_dir():
        raise UserError(
            f"--output {args.output} exists and is not a folder; results go into a folder: "
            "give a new or existing folder, or move the file away"
        )
    tasks = resolve_tasks(args.tasks, args.suite, load_task_files(args.task_file))
    isolation = None
    if any(t.kind == "code" for t in tasks):  # refuse before loading a model, not after
        isolation = isolation_summary(require_isolation(args.allow_unsafe_code))
        print(f"code isolation: {isolation}")
    baselines = load_baselines(args.baseline) if args.baseline else None
    device = resolve_device(args.device, "--device")
    options = EvalOptions(
        args.data_dir,
        args.limit,
        args.num_fewshot,
        args.seed,
        args.samples,
        args.temperature,
        SandboxLimits(timeout_s=args.timeout),
        allow_unsafe_code=args.allow_unsafe_code,
    )
    path = Path(args.checkpoint).expanduser()
    out_dir = args.output or refuse_symlink(path / "eval")  # a folder it names itself: never through a link

    def make_lm(loaded: LoadedModel) -> LanguageModel:
        return LanguageModel(
            loaded.model,
            loaded.tokenizer,
            device,
            args.batch_size,
            precision=args.precision,
            prefix_token=loaded.prefix_token,
            seed=args.seed,
            bos=loaded.bos,
        )

    if is_run_dir(path) and not args.latest:
        rows = sweep_run(
            path, tasks, options, make_lm, args.tokenizer, samples_dir=out_dir if args.log_samples else None
        )
        json_file, png = write_sweep(rows, out_dir, f"{path.name}: quality over training")
        last = rows[-1]
        print(markdown_table({"model": last["checkpoint"], **last}, baselines))
        print(f"sweep of {len(rows)} checkpoints: {json_file}, plot {png}")
        return 0
    loaded = load_model(path, args.tokenizer)
    print(f"evaluating {loaded.name} on {device} ({', '.join(t.name for t in tasks)})")
    results, skipped = evaluate(make_lm(loaded), tasks, options)
    meta = {
        "model": loaded.name,
        "path": str(path),
        "step": loaded.step,
        "tokens": loaded.tokens,
        "options": {
            "limit": args.limit,
            "num_fewshot": args.num_fewshot,
            "seed": args.seed,
            "samples": args.samples,
            "temperature": args.temperature,
            "precision": args.precision,
            "data_dir": str(args.data_dir or ""),
        },
        "code_isolation": isolation,
    }
    data = results_dict(results, skipped, meta)
    json_file = write_results(out_dir, data, results, baselines, args.log_samples)
    print(markdown_table(data, baselines))
    print(f"results: {json_file}")
    return 0 if results else 1
