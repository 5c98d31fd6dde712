"""Tasks from lm-evaluation-harness task YAML files (`hlat eval --task-file`).

The common subset of lm-eval's keys is read with lm-eval's meaning and mapped onto hlat's task
kinds, so a task file is scored by the same code as a built-in task. Any other key (include,
group, process_docs, a !function tag, ...) is refused with its file and line, since silently
ignoring it would score a different task than lm-eval does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import jinja2
import yaml

from hlat.errors import UserError
from hlat.eval.tasks.base import Dataset, Doc, Kind, Task
from hlat.eval.tasks.templates import TemplateError, render, to_choices, to_target, to_text

KEYS = {
    "task",
    "output_type",
    "dataset_path",
    "dataset_name",
    "dataset_kwargs",
    "test_split",
    "validation_split",
    "fewshot_split",
    "training_split",
    "doc_to_text",
    "doc_to_choice",
    "doc_to_target",
    "target_delimiter",
    "fewshot_delimiter",
    "description",
    "num_fewshot",
    "generation_kwargs",
    "filter_list",
    "metric_list",
    "metadata",
    "fewshot_config",
}
KINDS: dict[str, Kind] = {
    "multiple_choice": "multiple_choice",
    "loglikelihood": "loglikelihood",
    "loglikelihood_rolling": "perplexity",
    "generate_until": "generate",
}
METRICS = {  # per output type: the metrics it supports, the first list being lm-eval's default
    "multiple_choice": ("acc", "acc_norm"),
    "loglikelihood": ("perplexity", "acc"),
    "loglikelihood_rolling": ("word_perplexity", "byte_perplexity", "bits_per_byte"),
    "generate_until": ("exact_match",),
}
METRIC_KEYS = {"metric", "aggregation", "higher_is_better", "ignore_case", "ignore_punctuation", "regexes_to_ignore"}
GENERATION_KEYS = {"until", "max_gen_toks", "do_sample", "temperature"}
# fewshot_config.sampler: lm-eval's first_n takes the first k examples of the few-shot split, as
# hlat's "first" order does; its default draws with one Random per task in evaluation order, which
# hlat replaces by a draw per example (hlat.eval.tasks.base.choose_shots), so only first_n shows
# the same shots on both sides.
SAMPLERS: dict[str, Literal["first", "random"]] = {"first_n": "first", "default": "random"}
BUILDERS = ("json", "parquet", "arrow")
FIX = (
    'hlat reads a subset of lm-eval\'s task YAML (docs/evaluation.md, "Your own tasks"): '
    "write the task with those keys, e.g. prepare the data into a file instead of process_docs"
)


class TaskFileError(UserError, ValueError):
    """A task file hlat cannot read; the message names the file, the line and the fix."""


def load_task_files(paths: Iterable[Path]) -> list[Task]:
    """Tasks of each YAML file, a folder standing for its *.yaml and *.yml files (sorted)."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted([*path.glob("*.yaml"), *path.glob("*.yml")])
            if not found:
                raise TaskFileError(f"--task-file {path}: the folder has no .yaml or .yml files")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise TaskFileError(f"--task-file {path}: no such file or folder")
    return [load_task_file(f) for f in files]


def load_task_file(path: Path) -> Task:
    text = path.read_text(encoding="utf-8")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as err:
        raise TaskFileError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(root, yaml.MappingNode):
        raise TaskFileError(f"{path}: expected a mapping of lm-eval task keys (task:, dataset_path:, ...)")
    lines = {k.value: k.start_mark.line + 1 for k, _ in root.value}
    _refuse_tags(path, root)
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as err:  # e.g. a !!python/ tag
        raise TaskFileError(f"{path}: {err}; {FIX}") from err
    unknown = [k for k in config if k not in KEYS]
    if unknown:
        key = min(unknown, key=lambda k: lines[k])
        raise TaskFileError(f"{path}:{lines[key]}: key {key!r} is not supported; {FIX}")

    def fail(key: str, message: str) -> TaskFileError:
        where = f"{path}:{lines[key]}" if key in lines else str(path)
        return TaskFileError(f"{where}: {key}: {message}")

    try:
        return _task(config, path, fail)
    except jinja2.TemplateSyntaxError as err:
        raise TaskFileError(f"{path}: Jinja template error in {err.source!r}: {err.message}") from err
    except TemplateError as err:
        raise TaskFileError(f"{path}: {err}") from err


def _refuse_tags(path: Path, node: yaml.Node) -> None:
    """!function (a Python callable next to the file) and any other custom tag."""
    if node.tag.startswith("!"):
        raise TaskFileError(
            f"{path}:{node.start_mark.line + 1}: tag {node.tag} is not supported "
            f"(hlat runs no Python from task files); {FIX}"
        )
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            _refuse_tags(path, key)
            _refuse_tags(path, value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_tags(path, item)


def _task(config: dict[str, Any], path: Path, fail: Callable[[str, str], TaskFileError]) -> Task:
    for key in ("task", "dataset_path", "output_type"):
        if not config.get(key):
            raise fail(key, "missing; every task file needs task, dataset_path and output_type")
    output_type = config["output_type"]
    if output_type not in KINDS:
        raise fail("output_type", f"{output_type!r} is not supported; use one of {', '.join(KINDS)}")
    split = config.get("test_split") or config.get("validation_split")
    if not split:
        raise fail("test_split", "missing: name the split to evaluate (test_split or validation_split)")
    metrics, exact = _metrics(config, output_type, fail)
    has_choices = output_type == "multiple_choice"
    if has_choices and "doc_to_choice" not in config:
        raise fail("doc_to_choice", "missing: a multiple_choice task needs its choices")
    if "doc_to_target" not in config:
        raise fail("doc_to_target", "missing: the answer (or, for loglikelihood_rolling, the text)")
    target = to_target(config["doc_to_target"], has_choices)
    text = to_text(str(config.get("doc_to_text", "")))
    choices = to_choices(config["doc_to_choice"]) if has_choices else None
    kind = KINDS[output_type]
    fields: dict[str, Any] = {}
    if kind == "perplexity":  # lm-eval scores doc_to_target's text
        scored = target
        text, target = (lambda doc: str(scored(doc))), (lambda doc: None)
    elif kind == "multiple_choice":
        target = _choice_index(target, choices)
    elif kind == "generate":
        target = _answers(target)
        fields = _generation(config, metrics, fail) | exact
        metrics = fields.pop("metrics")
    description = str(config.get("description", ""))
    num_fewshot = config.get("num_fewshot") or 0
    if not isinstance(num_fewshot, int) or num_fewshot < 0:
        raise fail("num_fewshot", f"must be an integer >= 0, got {num_fewshot!r}")
    return Task(
        str(config["task"]),
        "task file",
        kind,
        _dataset(config, split, path, fail),
        doc_to_text=text,
        doc_to_target=target,
        doc_to_choice=choices,
        metrics=metrics,
        num_fewshot=0 if kind == "perplexity" else num_fewshot,
        fewshot_order=_fewshot_order(config, fail),
        description=render(description) if description else None,
        target_delimiter=str(config.get("target_delimiter", " ")),
        fewshot_delimiter=str(config.get("fewshot_delimiter", "\n\n")),
        notes=f"from {path}",
        **fields,
    )


def _fewshot_order(config: dict[str, Any], fail: Callable[[str, str], TaskFileError]) -> Literal["first", "random"]:
    fewshot = config.get("fewshot_config") or {}
    if not isinstance(fewshot, dict):
        raise fail("fewshot_config", f"expected a mapping with `sampler:`, got {fewshot!r}")
    extra = sorted(set(fewshot) - {"sampler"})
    if extra:
        raise fail("fewshot_config", f"key(s) {', '.join(extra)} not supported; only `sampler:` (first_n or default)")
    sampler = fewshot.get("sampler", "default")
    if sampler not in SAMPLERS:
        raise fail("fewshot_config", f"sampler {sampler!r} is not supported; use {' or '.join(SAMPLERS)}")
    return SAMPLERS[sampler]


def _dataset(config: dict[str, Any], split: str, path: Path, fail: Callable[[str, str], TaskFileError]) -> Dataset:
    """A builder (json/parquet/arrow) with dataset_kwargs.data_files, a local folder, or a hub id
    (then --data-dir/<task>/ is tried first, as for built-in tasks)."""
    source, name = str(config["dataset_path"]), config.get("dataset_name")
    kwargs = config.get("dataset_kwargs") or {}
    extra = [k for k in kwargs if k != "data_files"]
    if extra:
        raise fail("dataset_kwargs", f"only data_files is supported, not {', '.join(extra)}")
    fewshot = config.get("fewshot_split")
    if source in BUILDERS:
        files = kwargs.get("data_files")
        if not files:
            raise fail(
                "dataset_path", f"{source} needs dataset_kwargs.data_files (split: file, or a list of files per split)"
            )
        if not isinstance(files, dict):  # one file or list: the datasets library calls it train
            files = {"train": files}
        named = tuple(
            (str(s), tuple(_locate(f, path) for f in ([fs] if isinstance(fs, str) else fs))) for s, fs in files.items()
        )
        return Dataset(str(config["task"]), split, files=named, fewshot_split=fewshot)
    folder = Path(source).expanduser()
    if folder.is_dir() or (path.parent / folder).is_dir():
        folder = folder if folder.is_dir() else path.parent / folder
        return Dataset(str(config["task"]), split, path=str(folder), fewshot_split=fewshot)
    if source.startswith((".", "/", "~")):
        raise fail(
            "dataset_path",
            f"{source} is not a folder; give a folder of <split>.jsonl "
            f"files, a hub dataset id, or one of {', '.join(BUILDERS)} with data_files",
        )
    return Dataset(str(config["task"]), split, source, name, fewshot_split=fewshot)


def _locate(file: str, task_file: Path) -> str:
    """As lm-eval (the working directory), else beside the task file."""
    found = Path(file).expanduser()
    if not found.is_absolute() and not found.exists() and (task_file.parent / found).exists():
        found = task_file.parent / found
    return str(found)


def _metrics(
    config: dict[str, Any], output_type: str, fail: Callable[[str, str], TaskFileError]
) -> tuple[tuple[str, ...], dict[str, Any]]:
    """(metric names, exact_match's normalisation as Task fields)."""
    allowed = METRICS[output_type]
    entries = config.get("metric_list") or [{"metric": m} for m in allowed]
    names, exact = [], {"ignore": (), "ignore_case": False, "ignore_punctuation": False}
    for entry in entries:
        if not isinstance(entry, dict) or "metric" not in entry:
            raise fail("metric_list", "each entry is a mapping with a `metric:` key")
        metric = entry["metric"]
        if metric not in allowed:
            raise fail(
                "metric_list",
                f"metric {metric!r} is not supported for output_type {output_type}; use {', '.join(allowed)}",
            )
        extra = [k for k in entry if k not in METRIC_KEYS]
        if extra:
            raise fail("metric_list", f"{metric}: key(s) {', '.join(extra)} not supported")
        if metric == "exact_match":
            exact = {
                "ignore": tuple(entry.get("regexes_to_ignore") or ()),
                "ignore_case": bool(entry.get("ignore_case", False)),
                "ignore_punctuation": bool(entry.get("ignore_punctuation", False)),
            }
        names.append(metric)
    return tuple(names), exact


def _generation(
    config: dict[str, Any], metrics: tuple[str, ...], fail: Callable[[str, str], TaskFileError]
) -> dict[str, Any]:
    """Task fields of generate_until: stop sequences, token budget and one extractor per filter
    (one filter or none: `exact_match`; several: `exact_match,<filter name>`, lm-eval's keys)."""
    # lm-eval's default stops at the few-shot delimiter
    kwargs = config.get("generation_kwargs") or {"until": [config.get("fewshot_delimiter", "\n\n")]}
    extra = [k for k in kwargs if k not in GENERATION_KEYS]
    if extra:
        raise fail(
            "generation_kwargs", f"key(s) {', '.join(extra)} not supported; use {', '.join(sorted(GENERATION_KEYS))}"
        )
    if kwargs.get("do_sample") or kwargs.get("temperature", 0):
        raise fail("generation_kwargs", "only greedy decoding is supported (do_sample: false)")
    until = kwargs.get("until") or []
    filters = [
        (str(f.get("name", "none")), _filter_chain(f.get("filter") or [], fail))
        for f in config.get("filter_list") or []
    ]
    if not filters:
        filters = [("none", lambda text: text)]
    names = ["exact_match"] if len(filters) == 1 else [f"exact_match,{n}" for n, _ in filters]
    if metrics != ("exact_match",):
        raise fail("metric_list", "generate_until supports exactly one metric, exact_match")
    return {
        "metrics": tuple(names),
        "until": tuple([until] if isinstance(until, str) else until),
        "max_tokens": int(kwargs.get("max_gen_toks", 256)),
        "extractors": {n: fn for n, (_, fn) in zip(names, filters)},
    }


def _filter_chain(steps: list[dict[str, Any]], fail: Callable[[str, str], TaskFileError]) -> Callable[[str], str]:
    """regex (lm-eval's RegexFilter) and take_first (a no-op: hlat generates one response)."""
    chain: list[Callable[[str], str]] = []
    for step in steps:
        function = step.get("function")
        if function == "regex":
            chain.append(
                _regex_filter(
                    step.get("regex_pattern", r"#### (\-?[0-9\.\,]+)"),
                    int(step.get("group_select", 0)),
                    str(step.get("fallback", "[invalid]")),
                )
            )
        elif function != "take_first":
            raise fail("filter_list", f"filter function {function!r} is not supported; use regex and take_first")

    def apply(text: str) -> str:
        for fn in chain:
            text = fn(text)
        return text

    return apply


def _regex_filter(pattern: str, group: int, fallback: str) -> Callable[[str], str]:
    compiled = re.compile(pattern)

    def extract(text: str) -> str:
        found = compiled.findall(text)
        if not found:
            return fallback
        match = found[group]
        if isinstance(match, tuple):  # several groups: the first that matched
            match = next((m for m in match if m), fallback)
        return match.strip()

    return extract


def _choice_index(target: Callable[[Doc], Any], choices: Callable[[Doc], list[str]] | None) -> Callable[[Doc], int]:
    """lm-eval accepts the gold choice's index or its text."""

    def index(doc: Doc) -> int:
        gold = target(doc)
        return int(gold) if not isinstance(gold, str) else choices(doc).index(gold)

    return index


def _answers(target: Callable[[Doc], Any]) -> Callable[[Doc], list[str]]:
    def answers(doc: Doc) -> list[str]:
        gold = target(doc)
        return [str(a) for a in gold] if isinstance(gold, (list, tuple)) else [str(gold)]

    return answers
