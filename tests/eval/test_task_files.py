"""Task files (lm-eval task YAML): the shipped copies of built-in tasks ask the same as the built-in
definitions; keys outside the supported subset are refused with file and line; a hostile file
runs nothing; results and per-example records go through the usual paths, a run-directory sweep
included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from export import save_run
from hlat.cli import main
from hlat.eval import TASKS
from hlat.eval.tasks.task_file import TaskFileError, load_task_file, load_task_files
from hlat.eval.tasks.templates import TemplateError
from task_files import ARC_ROWS, write_jsonl

SHIPPED = Path(__file__).parents[2] / "src" / "hlat" / "eval" / "tasks" / "yaml"
ARC = {
    "question": "Which tool cuts wood?",
    "answerKey": "B",
    "choices": {"label": ["A", "B"], "text": ["a hammer", "a saw"]},
}
DOCS = {  # two examples per task, with the hub dataset's fields
    "arc_easy": [ARC, {**ARC, "answerKey": "A"}],
    "arc_challenge": [ARC, {**ARC, "question": "What cuts?"}],
    "boolq": [
        {"passage": "Saws cut wood.", "question": "do saws cut wood", "label": 1},
        {"passage": "Fish fly.", "question": "do fish fly", "label": 0},
    ],
    "openbookqa": [
        {
            "question_stem": "Saws are for",
            "answerKey": " B",
            "choices": {"label": ["A", "B"], "text": ["nails", "wood"]},
        },
        {
            "question_stem": "Light feeds",
            "answerKey": "A",
            "choices": {"label": ["A", "B"], "text": ["plants", "rocks"]},
        },
    ],
    "piqa": [
        {"goal": "cut wood", "sol1": "use a saw", "sol2": "use a fish", "label": 0},
        {"goal": "boil water", "sol1": "freeze it", "sol2": "heat it", "label": 1},
    ],
    "siqa": [
        {
            "context": "Ann cut wood.",
            "question": "Why?",
            "answerA": "cold",
            "answerB": "bored",
            "answerC": "fire",
            "label": "3",
        },
        {
            "context": "Bo ran.",
            "question": "How?",
            "answerA": "fast",
            "answerB": "slow",
            "answerC": "never",
            "label": "1",
        },
    ],
    "nq_open": [
        {"question": "who wrote hamlet", "answer": ["Shakespeare", "W. Shakespeare"]},
        {"question": "capital of france", "answer": ["Paris"]},
    ],
    "triviaqa": [
        {"question": "Who wrote Hamlet", "answer": {"aliases": ["Shakespeare", "Bard"]}},
        {"question": "Capital of France", "answer": {"aliases": ["Paris"]}},
    ],
    "gsm8k": [
        {"question": "2+2?", "answer": "Two and two.\n#### 4"},
        {"question": "1,000+1?", "answer": "Add.\n#### 1,001"},
    ],
    "perplexity": [{"text": "The quick brown fox."}, {"text": "A man on a roof."}],
}
GENERATIONS = [" The Paris, France", " so #### 1,001 then 7", " nothing", "$5.00 and #### 4."]


def test_shipped_task_files_ask_what_the_built_in_tasks_ask() -> None:
    shipped = {t.name: t for t in load_task_files([SHIPPED])}
    assert set(shipped) == set(DOCS)
    for name, mine in shipped.items():
        builtin, (doc, shot) = TASKS[name], DOCS[name]
        assert mine.kind == builtin.kind, name
        assert mine.prompt(doc, [shot]) == builtin.prompt(doc, [shot]), name
        assert mine.prompt(doc, []) == builtin.prompt(doc, []), name
        assert (mine.data.split, mine.data.fewshot_split, mine.num_fewshot) == (
            builtin.data.split,
            builtin.data.fewshot_split,
            builtin.num_fewshot,
        ), name
        assert (mine.data.hub, mine.data.hub_name) == (builtin.data.hub, builtin.data.hub_name), name
        if builtin.kind == "perplexity":
            assert mine.doc_to_text(doc) == builtin.doc_to_text(doc)
            assert mine.metrics == builtin.metrics
            continue
        assert mine.doc_to_target(doc) == builtin.doc_to_target(doc), name
        assert mine.target_delimiter == builtin.target_delimiter, name
        if builtin.kind == "multiple_choice":
            assert mine.doc_to_choice(doc) == builtin.doc_to_choice(doc), name
            assert mine.metrics == builtin.metrics, name
            continue
        assert (mine.until, mine.max_tokens) == (builtin.until, builtin.max_tokens), name
        assert (mine.ignore, mine.ignore_case, mine.ignore_punctuation) == (
            builtin.ignore,
            builtin.ignore_case,
            builtin.ignore_punctuation,
        ), name
        # the same answers extracted, metric by metric (gsm8k's keys are lm-eval's filter names)
        for ours, theirs in zip(mine.metrics, builtin.metrics):
            for text in GENERATIONS:
                assert mine.extractors[ours](text).strip() == builtin.extractors[theirs](text).strip()


@pytest.mark.parametrize(
    "text, where",
    [
        ("task: t\ninclude: base.yaml\n", "t.yaml:2: key 'include' is not supported"),
        (
            "task: t\noutput_type: multiple_choice\nprocess_docs: !function utils.process\n",
            "t.yaml:3: tag !function is not supported",
        ),
        (
            "task: t\ndataset_path: json\noutput_type: generate_until\ntest_split: test\n"
            "doc_to_target: a\nmetric_list:\n  - metric: bleu\n",
            "t.yaml:6: metric_list: metric 'bleu' is not supported for output_type generate_until",
        ),
        (
            "task: t\ndataset_path: json\noutput_type: multiple_choice\ntest_split: test\n"
            "doc_to_target: a\ndoc_to_choice: b\n",
            "t.yaml:2: dataset_path: json needs dataset_kwargs.data_files",
        ),
        (
            "task: t\ndataset_path: x\noutput_type: generate_until\ntest_split: test\ndoc_to_target: a\n"
            "filter_list:\n  - name: f\n    filter:\n      - function: majority_vote\n",
            "filter function 'majority_vote' is not supported",
        ),
        (
            "task: t\ndataset_path: x\noutput_type: generate_until\ntest_split: test\ndoc_to_target: a\n"
            "fewshot_config:\n  sampler: balanced\n",
            "t.yaml:6: fewshot_config: sampler 'balanced' is not supported",
        ),
        (
            "task: t\ndataset_path: x\noutput_type: generate_until\ntest_split: test\ndoc_to_target: a\n"
            "fewshot_config:\n  sampler: first_n\n  samples: []\n",
            "t.yaml:6: fewshot_config: key(s) samples not supported; only `sampler:` (first_n or default)",
        ),
    ],
)
def test_unsupported_keys_are_refused_with_file_and_line(tmp_path, text, where) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(TaskFileError, match="docs/evaluation.md|not supported|needs") as err:
        load_task_file(path)
    assert where in str(err.value)


def test_task_file_results_and_samples_in_a_sweep(model, tokenizer_file, tmp_path, capsys) -> None:
    """A task file through `hlat eval` on a run directory: every checkpoint's results in
    sweep.json and its per-example records under <output>/<checkpoint>/."""
    data = write_jsonl(tmp_path / "data" / "mine.jsonl", ARC_ROWS)
    (tmp_path / "mine.yaml").write_text(
        "task: mine\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\noutput_type: multiple_choice\ntest_split: test\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
        'doc_to_target: answerKey\ndoc_to_choice: "{{choices.label}}"\n'
    )
    write_jsonl(tmp_path / "eval" / "arc_easy" / "test.jsonl", ARC_ROWS)  # the shipped copy's data
    run = save_run(tmp_path / "run", model, tokenizer_file, [1, 2])
    out = tmp_path / "out"
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(run),
                "--task-file",
                str(tmp_path / "mine.yaml"),
                "--task-file",
                str(SHIPPED / "arc_easy.yaml"),
                "--data-dir",
                str(tmp_path / "eval"),
                "--output",
                str(out),
                "--log-samples",
                "--batch-size",
                "8",
            ]
        )
        == 0
    )
    rows = json.loads((out / "sweep.json").read_text())
    assert [set(r["tasks"]) for r in rows] == [{"mine", "arc_easy"}] * 2
    for row, task in [(row, task) for row in rows for task in ("mine", "arc_easy")]:
        lines = (out / row["checkpoint"] / f"samples_{task}.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert [r["doc"] for r in records] == list(range(len(ARC_ROWS)))
        assert all(len(r["loglikelihoods"]) == 3 for r in records)
    assert "hlat eval" not in capsys.readouterr().err
    # a refused file stops the command before any model is loaded: one message, exit 2
    (tmp_path / "bad.yaml").write_text("task: bad\ngroup: mine\n")
    assert main(["eval", "--checkpoint", str(run), "--task-file", str(tmp_path / "bad.yaml")]) == 2
    assert f"{tmp_path / 'bad.yaml'}:2: key 'group' is not supported" in capsys.readouterr().err
    # a template that reaches for Python through a filter is refused when it renders: one message, exit 2
    marker = tmp_path / "MARKER"
    (tmp_path / "evil.yaml").write_text(
        (tmp_path / "mine.yaml")
        .read_text()
        .replace("Question: {{question}}", f"{{{{ (lipsum|attr('__globals__')).os.system('touch {marker}') }}}}")
    )
    assert main(["eval", "--checkpoint", str(run), "--task-file", str(tmp_path / "evil.yaml")]) == 2
    assert "access to attribute '__globals__' of 'function' object is unsafe" in capsys.readouterr().err
    assert not marker.exists()


def test_local_folder_templates_and_a_missing_field(tmp_path) -> None:
    """dataset_path a folder beside the file; the gold choice given as its text; a Jinja
    description; a template naming a field the example lacks fails naming the fields it has."""
    from hlat.eval.tasks import load_split

    write_jsonl(
        tmp_path / "qa" / "test.jsonl",
        [{"q": "Which cuts?", "options": ["a saw", "a fish"], "gold": "a saw", "topic": "tools"}],
    )
    path = tmp_path / "qa.yaml"
    path.write_text(
        "task: qa\ndataset_path: qa\noutput_type: multiple_choice\ntest_split: test\n"
        'description: "About {{topic}}.\\n\\n"\ndoc_to_text: "Q: {{q}}\\nA:"\n'
        "doc_to_choice: options\ndoc_to_target: gold\n"
    )
    task = load_task_file(path)
    (doc,) = load_split(task.data, "test", None)
    assert task.prompt(doc, [doc]) == "About tools.\n\nQ: Which cuts?\nA: a saw\n\nQ: Which cuts?\nA:"
    assert (task.doc_to_choice(doc), task.doc_to_target(doc)) == (["a saw", "a fish"], 0)
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("{{q}}", "{{missing}}"))
    with pytest.raises(ValueError, match="'missing' is undefined; the example's fields are q, options"):
        load_task_file(bad).doc_to_text(doc)


ESCAPES = [  # each would run `touch MARKER` under a plain Jinja environment
    "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ lipsum.__globals__['os'].system('touch MARKER') }}",
    "{{ (lipsum|attr('__globals__')).os.system('touch MARKER') }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ (joiner|attr('\\x5f\\x5finit\\x5f\\x5f')|attr('\\x5f\\x5fglobals\\x5f\\x5f')).os.system('touch MARKER') }}",
    "{{ '{0.__init__.__globals__}'.format(cycler) }}",
]


@pytest.mark.parametrize("where", ["doc_to_text", "description", "doc_to_target", "doc_to_choice"])
@pytest.mark.parametrize("escape", ESCAPES)
def test_a_hostile_template_runs_nothing(tmp_path, monkeypatch, escape, where) -> None:
    """A task file from anywhere cannot run Python: the template is refused when the file is read
    (underscored names) or when it renders (the sandbox), and the marker is never written."""
    from hlat.eval.tasks import load_split

    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "qa" / "test.jsonl", [{"q": "Which cuts?", "options": ["a saw", "a fish"], "gold": 0}])
    keys = {"doc_to_text": '"Q: {{q}}"', "description": '""', "doc_to_target": "gold", "doc_to_choice": "options"}
    keys[where] = json.dumps(escape)
    path = tmp_path / "qa.yaml"
    path.write_text(
        "task: qa\ndataset_path: qa\noutput_type: multiple_choice\ntest_split: test\n"
        + "".join(f"{key}: {value}\n" for key, value in keys.items())
    )
    try:
        task = load_task_file(path)
        (doc,) = load_split(task.data, "test", None)
        with pytest.raises(TemplateError, match="unsafe|the example's fields"):
            task.prompt(doc, []), task.doc_to_target(doc), task.doc_to_choice(doc)
    except TaskFileError as err:  # refused as the file is read, naming it
        assert str(path) in str(err) and "a template may read the example's fields only" in str(err)
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.parametrize(
    "template, refusal",
    [
        ("{{ 'x' * 10 ** 8 }}", "an exponent above|a repetition of more than"),
        ("{{ ('x' * 1000) * 1001 }}", "a repetition of more than 1,000,000 items"),
        ("{% for i in range(10 ** 6) %}{% endfor %}", "Range too big"),
    ],
)
def test_a_template_cannot_exhaust_memory(template, refusal) -> None:
    from hlat.eval.tasks.templates import render

    with pytest.raises(TemplateError, match=refusal):
        render(template)({})


def test_a_python_yaml_tag_runs_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "t.yaml"
    path.write_text(
        "task: t\ndataset_path: x\noutput_type: generate_until\ntest_split: test\n"
        "doc_to_target: !!python/object/apply:os.system ['touch MARKER']\n"
    )
    with pytest.raises(TaskFileError, match="python/object/apply:os.system"):
        load_task_file(path)
    assert not (tmp_path / "MARKER").exists()


def _render(template: str, doc: dict) -> int:
    from hlat.eval.tasks.templates import render

    return len(render(template, "t.yaml:6: doc_to_text")(doc))


HUGE = {"big": "x" * 1_000_000, "lines": "a\n" * 500_000}  # fields of a (large) example
BOUNDED = [  # each would take gigabytes or hours unbounded; every width-taking filter is here
    ("{{ big|center(10**9) }}", "center width 1,000,000,000 is over"),
    ("{{ lines|indent(100) }}", "an indent would build more than"),
    ("{{ lines|indent(big) }}", "an indent would build more than"),
    ("{{ '%999999999s'|format(big) }}", "a % format width 999,999,999 is over"),
    ("{{ '%*s'|format(10**9, big) }}", "a '*' width or precision"),
    ("{{ ('%(a)s' * 1000)|format(a=big) }}", "a % format would build more than"),
    ("{{ '%999999999d' % 1 }}", "a % format width"),
    ("{{ big|replace('', big) }}", "a replace would build more than"),
    ("{{ big|replace('x', big, 9) }}", "a replace would build more than"),
    ("{{ ([big] * 1000)|join }}", "a repetition would build more than"),
    ("{{ [big, big, big, big, big]|join(big) }}", "a join would build more than"),
    ("{{ big|wordwrap(1, wrapstring=big) }}", "a wordwrap would build more than"),
    ("{{ [1]|batch(10**9, 0)|list }}", "batch size"),
    ("{{ [1]|slice(10**9)|list }}", "slice count"),
    ("{{ [[1]]|tojson(indent=10**9) }}", "a tojson indent would build"),
    ("{{ lipsum(10**6) }}", "lipsum would build more than"),
    ("{{ ['x']|map('center', 10**9)|join }}", "center width"),
    # str methods, however they are reached
    ("{{ 'x'.center(10**9) }}", "str.center width"),
    ("{{ ('x'|attr('rjust'))(10**9) }}", "str.rjust width"),
    ("{{ '1'.zfill(10**9) }}", "str.zfill width"),
    ("{{ lines.expandtabs(10**4) }}", "str.expandtabs would build"),
    ("{{ big.replace('', big) }}", "a replace would build"),
    ("{{ big.join(big) }}", "a join would build"),
    ("{{ '{:>999999999}'.format(1) }}", "a format width 999,999,999"),
    ("{{ '{:>{}}'.format(1, 10**9) }}", "a format width 1,000,000,000"),
    ("{{ ('{0}' * 10**5).format(big) }}", "a format would build"),
    ("{{ ('{a}' * 10**5).format_map({'a': big}) }}", "a format would build"),
    # concatenation, output and building
    (
        "{% set ns = namespace(s=big) %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "the output would build more than",
    ),
    ("{% set ns = namespace(s=big) %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "+ of more"),
    ("{% for i in range(10**5) %}{{ big }}{% endfor %}", "the output would build more than"),
    ("{% macro m() %}{% for i in range(10**5) %}{{ big }}{% endfor %}{% endmacro %}{{ m()|length }}", "units of work"),
    ("{{ [[big] * 1000] * 1000 }}", "a repetition would build more than"),
    ("{{ ((((9 ** 64) ** 64) ** 64) ** 64) ** 64 }}", "a power of more than"),
    ("{% set ns = namespace(x=3) %}{% for i in range(64) %}{% set ns.x = ns.x * ns.x %}{% endfor %}", "a product"),
    # time: loops and calls
    ("{% for i in range(10**5) %}{% for j in range(10**5) %}{% endfor %}{% endfor %}", "units of work"),
    (
        "{% macro m(n) %}{% if n %}{{ m(n - 1) }}{{ m(n - 1) }}{% endif %}{% endmacro %}{{ m(60) }}",
        "units of work|a render of more than",
    ),
    ("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "RecursionError"),
]


@pytest.mark.parametrize("template, refusal", BOUNDED)
def test_a_template_cannot_exhaust_memory_or_time(template, refusal) -> None:
    """Each case runs in a child limited to 1 GiB more and 30 s: unbounded, it is killed or times
    out; bounded, it is refused with one line naming the file and field, within the time limit."""
    from containment import contained
    from hlat.eval.tasks import template_bounds

    outcome = contained(_render, template, HUGE, memory_mb=1024, timeout_s=30)
    assert outcome.kind == "raised", outcome
    assert outcome.error.startswith("TemplateError: t.yaml:6: doc_to_text: template "), outcome.error
    assert any(part in outcome.error for part in refusal.split("|")), outcome.error
    assert "\n" not in outcome.error
    assert outcome.seconds < template_bounds.MAX_SECONDS + 15, outcome  # slack for a loaded machine


def test_bounded_templates_still_render_what_lm_eval_renders() -> None:
    from hlat.eval.tasks.templates import render

    doc = {"q": "Why?", "choices": ["a", "b"], "n": 3}
    template = (
        "{{ q|center(8) }}|{{ choices|join(', ') }}|{{ '%03d'|format(n) }}|{{ '{:>4}'.format(n) }}|"
        "{{ q|replace('?', '!') }}|{{ ('a\\nb')|indent(2) }}|{{ q ~ '-' ~ n }}|"
        "{% for c in choices %}{{ loop.index }}{{ c }}{% endfor %}|{{ 'x' * 3 }}|{{ '%s=%d' % (q, n) }}"
    )
    assert render(template)(doc) == "  Why?  |a, b|003|   3|Why!|a\n  b|Why?-3|1a2b|xxx|Why?=3"


def _load(path: str) -> str:
    load_task_file(Path(path))
    return "loaded"


def test_yaml_aliases_and_deep_nesting_are_refused_at_once(tmp_path) -> None:
    """A 'billion laughs' file (ten lines, 10**9 nodes through aliases) and 10**5 nested lists."""
    from containment import contained

    laughs = tmp_path / "laughs.yaml"
    levels = "".join(f"l{i + 1}: &l{i + 1} [{', '.join([f'*l{i}'] * 10)}]\n" for i in range(9))
    laughs.write_text("task: t\nl0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + levels)
    deep = tmp_path / "deep.yaml"
    deep.write_text("task: " + "[" * 10**5 + "]" * 10**5 + "\n")
    for path, refusal in [(laughs, "alias *l0 is not supported"), (deep, "nested deeper than 50 levels")]:
        outcome = contained(_load, str(path), memory_mb=1024, timeout_s=30)
        assert outcome.kind == "raised" and outcome.error.startswith(f"TaskFileError: {path}: "), outcome
        assert refusal in outcome.error and "\n" not in outcome.error, outcome.error
        assert outcome.seconds < 20, outcome  # unbounded, it is killed at 30 s


HEAD = "task: t\ndataset_path: x\noutput_type: generate_until\ntest_split: test\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (HEAD + "doc_to_target: a\nnum_fewshot: two\n", "t.yaml:6: num_fewshot: expected an integer, got str"),
        (HEAD + "doc_to_target: a\nnum_fewshot: true\n", "t.yaml:6: num_fewshot: expected an integer, got bool"),
        (HEAD + "doc_to_target: {a: 1}\n", "t.yaml:5: doc_to_target: expected a string or an integer or a list"),
        (HEAD + "doc_to_target: a\ndoc_to_text: [1]\n", "t.yaml:6: doc_to_text: expected a string, got list"),
        (HEAD + "doc_to_target: a\ngeneration_kwargs: {max_gen_toks: lots}\n", "max_gen_toks: expected an integer"),
        (HEAD + "doc_to_target: a\ngeneration_kwargs: {until: 5}\n", "t.yaml:6: generation_kwargs: until"),
        (HEAD + "doc_to_target: a\nfilter_list: [x]\n", "t.yaml:6: filter_list: each entry is a mapping"),
        (
            HEAD + "doc_to_target: a\nfilter_list:\n  - name: f\n    filter:\n      - function: regex\n"
            "        regex_pattern: '(['\n",
            "t.yaml:6: filter_list: regex_pattern '([' is not a valid regular expression",
        ),
        (
            HEAD + "doc_to_target: a\nmetric_list:\n  - metric: exact_match\n    regexes_to_ignore: ['*']\n",
            "t.yaml:6: metric_list: regexes_to_ignore '*' is not a valid regular expression",
        ),
        (HEAD + "doc_to_target: a\nfewshot_config: {sampler: [1]}\n", "t.yaml:6: fewshot_config: sampler [1]"),
        (
            HEAD.replace("path: x", "path: json") + "doc_to_target: a\ndataset_kwargs: {data_files: {test: 3}}\n",
            "t.yaml:6: dataset_kwargs: data_files: each split names a file or a list of files",
        ),
        (HEAD + "doc_to_target: '{{ a'\n", "Jinja template error in '{{ a'"),
        ("task: t\n1: x\n", "t.yaml:2: key 1 is not supported"),
        ("? [task]\n: t\n", "t.yaml:1: a key must be a plain name"),
    ],
)
def test_type_and_regex_errors_name_the_file_and_field(tmp_path, text, message) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(TaskFileError) as err:
        load_task_file(path)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "keys, doc, message",
    [
        ({"doc_to_text": '"{{ 1 / q }}"'}, {"q": 0}, "doc_to_text: template '{{ 1 / q }}' failed: ZeroDivisionError"),
        ({"doc_to_text": '"{{ q + 1 }}"'}, {"q": "a"}, "doc_to_text: template '{{ q + 1 }}' failed: TypeError"),
        ({"doc_to_target": "gold"}, {"gold": 7}, "doc_to_target: '7' is neither one of the example's 2 choices"),
        ({"doc_to_choice": '"{{ q }}"'}, {"q": "a saw"}, "doc_to_choice: template '{{ q }}' rendered 'a saw', not"),
        ({"doc_to_choice": "q"}, {"q": 5}, "doc_to_choice: 'q' gave '5', not a list of choices"),
    ],
)
def test_template_errors_on_an_example_name_the_file_and_field(tmp_path, keys, doc, message) -> None:
    fields = {"doc_to_text": '"Q"', "doc_to_target": "0", "doc_to_choice": "[a, b]"} | keys
    path = tmp_path / "t.yaml"
    path.write_text(
        "task: t\ndataset_path: x\noutput_type: multiple_choice\ntest_split: test\n"
        + "".join(f"{key}: {value}\n" for key, value in fields.items())
    )
    task = load_task_file(path)
    with pytest.raises(TemplateError) as err:
        task.prompt(doc, []), task.doc_to_choice(doc), task.doc_to_target(doc)
    assert str(err.value).startswith(f"{path}:") and message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)
