"""A property-based pass over what users hand hlat: config TOML text and command-line overrides,
task files, and JSONL data lines. Whatever the input, hlat returns a value or raises one of its
one-line errors (UserError), never another exception. Derandomized (the same examples on every
run, as CI needs), with few examples and a deadline each, so the pass costs a few seconds."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlat.config.load import load_config
from hlat.config.reference import sections
from hlat.errors import ConfigError, UserError
from hlat.eval.tasks.task_file import KEYS, load_task_file
from hlat.toml_value import toml_value

PASS = settings(
    max_examples=30,
    deadline=2000,  # ms per example: a bound on time, far above what a valid input takes
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
FIELDS = sorted(f"{name}.{field}" for name, cls in sections().items() for field in cls.__dataclass_fields__)
SCALARS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3))


def one_line_error_or_value(call: Any, *args: Any) -> None:
    """A configuration's errors are one line per problem (under "invalid configuration:"), the
    others one line."""
    try:
        call(*args)
    except ConfigError as err:
        assert err.problems and all(field and message for field, message in err.problems), str(err)
    except UserError as err:
        assert str(err).strip() and "\n" not in str(err), str(err)


def _load(toml_text: str, overrides: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "run.toml")
        path.write_text(toml_text, encoding="utf-8", errors="surrogatepass")
        load_config(config_file=path, overrides=overrides)


@PASS
@given(table=st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=4), preset=st.one_of(st.none(), SCALARS))
def test_any_config_file_of_known_fields_loads_or_is_refused_in_one_line(table, preset) -> None:
    lines = [] if preset is None else [f"preset = {toml_value(preset)}"]
    by_section: dict[str, list[str]] = {}
    for key, value in table.items():
        section, field = key.split(".")
        by_section.setdefault(section, []).append(f"{field} = {toml_value(value)}")
    for section, entries in by_section.items():
        lines += [f"[{section}]", *entries]
    one_line_error_or_value(_load, "\n".join(lines) + "\n", [])


@PASS
@given(text=st.text(max_size=200))
def test_any_toml_text_loads_or_is_refused_in_one_line(text) -> None:
    one_line_error_or_value(_load, text, [])


@PASS
@given(
    overrides=st.lists(
        st.one_of(
            st.builds(lambda k, v: f"--{k}={v}", st.sampled_from(FIELDS), st.text(max_size=12)),
            st.sampled_from(FIELDS).map(lambda k: f"--{k}"),
            st.text(max_size=12),
        ),
        max_size=4,
    )
)
def test_any_command_line_overrides_load_or_are_refused_in_one_line(overrides) -> None:
    one_line_error_or_value(_load, "", overrides)


TASK_VALUES = st.recursive(
    SCALARS | st.none(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
TEMPLATES = st.sampled_from(
    ["{{ q }}", "{{ q|upper }}", "{% for c in cs %}{{ c }}{% endfor %}", "{{", "{{ 1/0 }}", "q"]
)


def _task(config: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "t.yaml")
        path.write_text(json.dumps(config))  # JSON is YAML
        task = load_task_file(path)
        doc = {"q": "Why?", "cs": ["a", "b"], "gold": 0}
        task.prompt(doc, [doc])
        task.doc_to_target(doc)
        if task.doc_to_choice is not None:
            task.doc_to_choice(doc)


@PASS
@given(
    base=st.fixed_dictionaries(
        {
            "task": st.one_of(st.just("t"), SCALARS),
            "dataset_path": st.one_of(st.just("x"), SCALARS),
            "output_type": st.one_of(
                st.sampled_from(["multiple_choice", "generate_until", "loglikelihood", "loglikelihood_rolling"]),
                SCALARS,
            ),
            "test_split": st.one_of(st.just("test"), SCALARS),
            "doc_to_text": st.one_of(TEMPLATES, TASK_VALUES),
            "doc_to_target": st.one_of(TEMPLATES, st.just("gold"), TASK_VALUES),
            "doc_to_choice": st.one_of(st.just("cs"), TEMPLATES, TASK_VALUES),
        }
    ),
    extra=st.dictionaries(st.sampled_from(sorted(KEYS)), TASK_VALUES, max_size=3),
)
def test_any_task_file_loads_and_renders_or_is_refused_in_one_line(base, extra) -> None:
    one_line_error_or_value(_task, base | extra)


@PASS
@given(text=st.text(max_size=300))
def test_any_task_file_text_loads_or_is_refused_in_one_line(text) -> None:
    def load() -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder, "t.yaml")
            path.write_text(text, encoding="utf-8", errors="surrogatepass")
            load_task_file(path)

    one_line_error_or_value(load)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
LINES = st.one_of(
    st.dictionaries(st.sampled_from(["text", "other"]), JSON_VALUES, max_size=2).map(json.dumps),
    JSON_VALUES.map(json.dumps),
    st.text(max_size=40),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)


@settings(PASS, max_examples=20)  # each example writes and maps an Arrow file
@given(lines=st.lists(LINES, max_size=6), skip=st.booleans())
def test_any_jsonl_lines_convert_or_are_refused_in_one_line(lines, skip) -> None:
    from hlat.data.records import convert_to_arrow

    def convert() -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder, "docs.jsonl")
            path.write_bytes("".join(f"{line}\n" for line in lines).encode("utf-8", "surrogatepass"))
            convert_to_arrow(path, "jsonl", "text", skip, Path(folder, "cache"))

    one_line_error_or_value(convert)
