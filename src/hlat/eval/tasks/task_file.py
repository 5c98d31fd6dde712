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
MAX_BYTES = 1 << 20  # of a task file: lm-eval's are a few hundred bytes
MAX_NESTING = 50  # of the YAML's mappings and lists
# each key's YAML types (None: absent); nested values are checked where they are read
TYPES: dict[str, tuple[type, ...]] = {
    "task": (str,),
    "output_type": (str,),
    "dataset_path": (str,),
    "dataset_name": (str,),
    "dataset_kwargs": (dict,),
    "test_split": (str,),
    "validation_split": (str,),
    "fewshot_split": (str,),
    "training_split": (str,),
    "doc_to_text": (str,),
    "doc_to_choice": (str, list, dict),
    "doc_to_target": (str, int, list),
    "target_delimiter": (str,),
    "fewshot_delimiter": (str,),
    "description": (str,),
    "num_fewshot": (int,),
    "generation_kwargs": (dict,),
    "filter_list": (list,),
    "metric_list": (list,),
    "metadata": (dict,),
    "fewshot_config": (dict,),
}
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


class _Loader(yaml.SafeLoader):
    """Safe YAML without aliases: `*name` repeats a node by reference, so a few lines can stand for
    an exponential tree (a "billion laughs" file); lm-eval's task files do not use them."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.MarkedYAMLError(
                problem=f"alias *{event.anchor} is not supported (write the value out)",
                problem_mark=event.start_mark,
            )
        self.depth = getattr(self, "depth", 0) + 1  # composing recurses once per level
        try:
            if self.depth > MAX_NESTING:
                raise yaml.MarkedYAMLError(
                    problem=f"nested deeper than {MAX_NESTING} levels", problem_mark=self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load_task_file(path: Path) -> Task:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TaskFileError(f"{path}: cannot be read as a UTF-8 text file ({err})") from err
    if len(data) > MAX_BYTES:
        raise TaskFileError(f"{path}: over {MAX_BYTES >> 20} MiB; a task file holds keys, not data ({FIX})")
    loader = None
    try:
        loader = _Loader(text)  # refuses control characters right away
        root = loader.get_single_node()
        if not isinstance(root, yaml.MappingNode):
            raise TaskFileError(f"{path}: expected a mapping of lm-eval task keys (task:, dataset_path:, ...)")
        bad_key = next((k for k, _ in root.value if not isinstance(k, yaml.ScalarNode)), None)
        if bad_key is not None:
            raise TaskFileError(f"{path}:{bad_key.start_mark.line + 1}: a key must be a plain name; {FIX}")
        lines = {k.value: k.start_mark.line + 1 for k, _ in root.value}
        _refuse_tags(path, root)
        config = loader.construct_document(root)  # e.g. a !!python/ tag fails here
    except yaml.YAMLError as err:
        raise TaskFileError(f"{path}: not valid YAML for hlat ({_one_line(err)}); {FIX}") from err
    finally:
        if loader is not None:
            loader.dispose()
    unknown = [k for k in config if k not in KEYS]
    if unknown:
        key = min(unknown, key=lambda k: lines.get(str(k), 0))
        raise TaskFileError(f"{path}:{lines.get(str(key), 1)}: key {key!r} is not supported; {FIX}")

    def field(key: str) -> str:
        """Where a key's value is: `path:line: key`, the start of every message about it."""
        return f"{path}:{lines[key]}: {key}" if key in lines else f"{path}: {key}"

    def fail(key: str, message: str) -> TaskFileError:
        return TaskFileError(f"{field(key)}: {message}")

    for key, value in config.items():
        if value is not None and (not isinstance(value, TYPES[key]) or isinstance(value, bool)):
            names = " or ".join(
                {str: "a string", int: "an integer", list: "a list", dict: "a mapping"}[t] for t in TYPES[key]
            )
            raise fail(key, f"expected {names}, got {type(value).__name__} {str(value)[:60]!r}")
    try:
        return _task(config, path, fail, field)
    except jinja2.TemplateSyntaxError as err:
        raise TaskFileError(f"{path}: Jinja template error in {_shown(err.source)}: {err.message}") from err
    except TemplateError as err:  # its message starts with the file and key
        raise TaskFileError(str(err)) from err


def _one_line(err: yaml.YAMLError) -> str:
    return " ".join(str(err).split())


def _shown(text: str | None) -> str:
    return repr((text or "")[:100])


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


def _task(
    config: dict[str, Any], path: Path, fail: Callable[[str, str], TaskFileError], field: Callable[[str], str]
) -> Task:
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
    target = to_target(config["doc_to_target"], has_choices, field("doc_to_target"))
    text = to_text(str(config.get("doc_to_text") or ""), field("doc_to_text"))
    choices = to_choices(config["doc_to_choice"], field("doc_to_choice")) if has_choices else None
    kind = KINDS[output_type]
    fields: dict[str, Any] = {}
    if kind == "perplexity":  # lm-eval scores doc_to_target's text
        scored = target
        text, target = (lambda doc: str(scored(doc))), (lambda doc: None)
    elif kind == "multiple_choice":
        target = _choice_index(target, choices, field("doc_to_target"))
    elif kind == "generate":
        target = _answers(target)
        fields = _generation(config, metrics, fail) | exact
        metrics = fields.pop("metrics")
    description = str(config.get("description") or "")
    num_fewshot = config.get("num_fewshot") or 0
    if num_fewshot < 0:
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
        description=render(description, field("description")) if description else None,
        target_delimiter=_or(config.get("target_delimiter"), " "),
        fewshot_delimiter=_or(config.get("fewshot_delimiter"), "\n\n"),
        notes=f"from {path}",
        **fields,
    )


def _or(value: str | None, default: str) -> str:
    return default if value is None else value


def _fewshot_order(config: dict[str, Any], fail: Callable[[str, str], TaskFileError]) -> Literal["first", "random"]:
    fewshot = config.get("fewshot_config") or {}
    if not isinstance(fewshot, dict):
        raise fail("fewshot_config", f"expected a mapping with `sampler:`, got {fewshot!r}")
    extra = sorted(str(k) for k in fewshot if k != "sampler")
    if extra:
        raise fail("fewshot_config", f"key(s) {', '.join(extra)} not supported; only `sampler:` (first_n or default)")
    sampler = fewshot.get("sampler", "default")
    if not isinstance(sampler, str) or sampler not in SAMPLERS:
        raise fail("fewshot_config", f"sampler {sampler!r} is not supported; use {' or '.join(SAMPLERS)}")
    return SAMPLERS[sampler]


def _dataset(config: dict[str, Any], split: str, path: Path, fail: Callable[[str, str], TaskFileError]) -> Dataset:
    """A builder (json/parquet/arrow) with dataset_kwargs.data_files, a local folder, or a hub id
    (then --data-dir/<task>/ is tried first, as for built-in tasks)."""
    source, name = str(config["dataset_path"]), config.get("dataset_name")
    kwargs = config.get("dataset_kwargs") or {}
    extra = [str(k) for k in kwargs if k != "data_files"]
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
        if not all(_is_files(f) for f in files.values()):
            raise fail("dataset_kwargs", "data_files: each split names a file or a list of files")
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


def _is_files(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(f, str) for f in value))


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
        extra = [str(k) for k in entry if k not in METRIC_KEYS]
        if extra:
            raise fail("metric_list", f"{metric}: key(s) {', '.join(extra)} not supported")
        if metric == "exact_match":
            ignore = entry.get("regexes_to_ignore") or []
            if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
                raise fail("metric_list", "regexes_to_ignore: expected a list of regular expressions")
            for pattern in ignore:
                _compile(pattern, "metric_list", "regexes_to_ignore", fail)
            exact = {
                "ignore": tuple(ignore),
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
    extra = [str(k) for k in kwargs if k not in GENERATION_KEYS]
    if extra:
        raise fail(
            "generation_kwargs", f"key(s) {', '.join(extra)} not supported; use {', '.join(sorted(GENERATION_KEYS))}"
        )
    if kwargs.get("do_sample") or kwargs.get("temperature", 0):
        raise fail("generation_kwargs", "only greedy decoding is supported (do_sample: false)")
    until = kwargs.get("until") or []
    if not (isinstance(until, str) or (isinstance(until, list) and all(isinstance(u, str) for u in until))):
        raise fail("generation_kwargs", f"until: expected a string or a list of strings, got {until!r:.60}")
    max_tokens = kwargs.get("max_gen_toks", 256)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise fail("generation_kwargs", f"max_gen_toks: expected an integer >= 1, got {max_tokens!r:.60}")
    entries = config.get("filter_list") or []
    if not all(isinstance(f, dict) and isinstance(f.get("filter") or [], list) for f in entries):
        raise fail("filter_list", "each entry is a mapping with `name:` and a list under `filter:`")
    filters = [(str(f.get("name", "none")), _filter_chain(f.get("filter") or [], fail)) for f in entries]
    if not filters:
        filters = [("none", lambda text: text)]
    names = ["exact_match"] if len(filters) == 1 else [f"exact_match,{n}" for n, _ in filters]
    if metrics != ("exact_match",):
        raise fail("metric_list", "generate_until supports exactly one metric, exact_match")
    return {
        "metrics": tuple(names),
        "until": tuple([until] if isinstance(until, str) else until),
        "max_tokens": max_tokens,
        "extractors": {n: fn for n, (_, fn) in zip(names, filters)},
    }


def _filter_chain(steps: list[dict[str, Any]], fail: Callable[[str, str], TaskFileError]) -> Callable[[str], str]:
    """regex (lm-eval's RegexFilter) and take_first (a no-op: hlat generates one response)."""
    chain: list[Callable[[str], str]] = []
    for step in steps:
        function = step.get("function") if isinstance(step, dict) else None
        if function == "regex":
            pattern, group = step.get("regex_pattern", r"#### (\-?[0-9\.\,]+)"), step.get("group_select", 0)
            if not isinstance(pattern, str) or not isinstance(group, int) or isinstance(group, bool):
                raise fail("filter_list", "regex: regex_pattern is a string and group_select an integer")
            chain.append(
                _regex_filter(
                    _compile(pattern, "filter_list", "regex_pattern", fail),
                    group,
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


def _compile(pattern: str, key: str, field: str, fail: Callable[[str, str], TaskFileError]) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as err:
        raise fail(key, f"{field} {pattern[:80]!r} is not a valid regular expression ({err})") from err


def _regex_filter(compiled: re.Pattern[str], group: int, fallback: str) -> Callable[[str], str]:
    def extract(text: str) -> str:
        found = compiled.findall(text)
        if not found or not -len(found) <= group < len(found):  # lm-eval: a group past the matches is no answer
            return fallback
        match = found[group]
        if isinstance(match, tuple):  # several groups: the first that matched
            match = next((m for m in match if m), fallback)
        return match.strip()

    return extract


def _choice_index(
    target: Callable[[Doc], Any], choices: Callable[[Doc], list[str]], where: str
) -> Callable[[Doc], int]:
    """lm-eval accepts the gold choice's index or its text."""

    def index(doc: Doc) -> int:
        gold, options = target(doc), choices(doc)
        if isinstance(gold, str) and gold in options:
            return options.index(gold)
        if isinstance(gold, int) and not isinstance(gold, bool) and 0 <= gold < len(options):
            return gold
        raise TemplateError(
            f"{where}: {str(gold)[:80]!r} is neither one of the example's {len(options)} choices nor "
            f"an index of one (0 to {len(options) - 1})"
        )

    return index


def _answers(target: Callable[[Doc], Any]) -> Callable[[Doc], list[str]]:
    def answers(doc: Doc) -> list[str]:
        gold = target(doc)
        return [str(a) for a in gold] if isinstance(gold, (list, tuple)) else [str(gold)]

    return answers
