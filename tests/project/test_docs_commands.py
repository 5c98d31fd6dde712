"""Every command shown in the README and docs/*.md runs as written, in a fresh directory.

Commands come from the ```bash blocks (one per line, `&&` and `;` separating several) and from
`$ `-prompted lines in other blocks, whose output lines the docs show are compared too ("..."
stands for any text). They run in document order in one working directory, so `hlat export
runs/tiny` finds what `hlat train` wrote. `hlat ...` runs through hlat.cli.main in this process;
`torchrun --nproc_per_node N -m hlat ...` runs hlat.cli.main on N gloo ranks as a scenario of the
shared launch (tests/project/docs_torchrun_worker.py), in a directory of its own. Commands that would train for
minutes get overrides appended that shorten them (SHORTENED); the few that need the network or
the user's own files are listed in EXCLUDED with the reason. Both tables must name commands the
docs show, so neither can drift from them.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from safetensors.torch import save_file

from hlat.cli import main
from hlat.config.model import ModelConfig
from hlat.model import Llama
from hlat.model.hf import hf_config_dict, hlat_to_hf
from runs import Scenario, ScenarioResults

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# one step, no validation pass: the commands' own settings (preset, layout, file) are what is tested
STEPS = ["--train.steps", "1", "--train.log_every", "1", "--eval.every", "0"]
SMALL_BATCH = ["--train.global_batch", "2"]  # one process: the preset's micro-batch adapts to it
NO_EXTRAS = ["--train.sample_prompt", "", "--train.plot", "false"]

EXCLUDED = {
    "python -m pip install torch==2.13.0 -e .": "installs packages from the network",
    "python -m pip install -c requirements/test.lock torch==2.13.0 -e .[test]": "installs packages from the network",
    "python -m pytest": "the whole suite, which this test is part of (CI runs it: .ci/run)",
    "hlat prepare ...": "a pointer to docs/data.md, not a command",
    "hlat tokenizer train ...": "a pointer to docs/data.md, not a command",
    "hlat eval ...": "a pointer to docs/evaluation.md, not a command",
    "hlat eval --checkpoint runs/tiny/checkpoints/step_00000200 --tasks arc_easy,humaneval --data-dir data/eval": "needs the task files a user downloads into data/eval, and runs/tiny trained to step 200",
    "hlat eval --checkpoint runs/tiny --suite hlat --data-dir data/eval": "needs the task files a user downloads into data/eval",
    "hlat eval --checkpoint /models/llama-2-7b-hf --suite hlat --precision mixed --baseline llama2.json": "needs LLaMA-2 7B from the Hugging Face hub (network, 13 GB) and the user's baseline file",
    "python -m pip install torch==2.13.0 -e . --extra-index-url https://download.pytorch.org/whl/cpu": "installs packages from the network",
    "python -m pip install torch==2.13.0 torch-neuronx==2.13.* neuronx-cc==2.* nki --extra-index-url https://pip.repos.neuron.amazonaws.com --extra-index-url https://download.pytorch.org/whl/cpu": "installs packages from the network, for Trainium",
    "python -c import torch; print(torch.__version__, torch.accelerator.current_accelerator())": "prints neuron only on a Trainium instance with torch-neuronx",
    "torchrun --standalone --nproc_per_node 64 -m hlat train --preset hlat-7b --train.device neuron": "needs a Trainium instance with torch-neuronx",
}
SHORTENED = {  # appended overrides (the last value of a field wins); each keeps the command's own settings
    "hlat train": [*STEPS, *SMALL_BATCH],
    # the end-of-run sample and loss plot: plain `hlat train` shows them; the small model's greedy
    # sample alone took a third of this command's time
    "hlat train --preset small --train.steps 500": [*STEPS, *SMALL_BATCH, *NO_EXTRAS],
    "hlat train --config my.toml --optim.lr=1e-3": [*STEPS, *SMALL_BATCH],
    "hlat train --resume": ["--train.steps", "2", *STEPS[2:], *SMALL_BATCH],  # one step more than `hlat train` ran
    # 2 micro-batches of 2, the fewest a dp 2 run splits
    "hlat train --train.deterministic true --train.micro_batch 2 --train.run_dir runs/det": [
        *STEPS,
        "--train.global_batch",
        "4",
    ],
    "torchrun --standalone --nproc_per_node 2 -m hlat train --train.deterministic true --train.micro_batch 2 "
    "--parallel.dp_sharding fsdp --train.run_dir runs/det-fsdp": [*STEPS, "--train.global_batch", "4"],
    "torchrun --standalone --nproc_per_node 4 -m hlat train --parallel.tp 2 --parallel.dp_sharding zero2": [
        *STEPS,
        "--train.run_dir",
        "runs/tp2",
    ],
    "torchrun --standalone --nproc_per_node 4 -m hlat train --parallel.pp 2 --parallel.dp_sharding fsdp": [
        *STEPS,
        "--train.run_dir",
        "runs/pp2",
    ],
    "torchrun --standalone --nproc_per_node 2 -m hlat train --parallel.cp 2": [*STEPS, "--train.run_dir", "runs/cp2"],
}
MY_TOML = 'preset = "tiny"\n'  # the README's my.toml: "may name `preset = \"small\"`"


@dataclass(frozen=True)
class Shown:
    where: str
    argv: tuple[str, ...]
    output: str | None  # the output the docs print after a `$ ` command, if any

    @property
    def text(self) -> str:
        return " ".join(self.argv)


def _commands(line: str) -> list[tuple[str, ...]]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", ";"):
            out.append([])
        else:
            out[-1].append(token)
    return [tuple(c) for c in out if c]


def shown_commands() -> list[Shown]:
    found: list[Shown] = []
    for doc in DOCUMENTS:
        for match in re.finditer(r"^```(\w*)\n(.*?)^```", doc.read_text(), re.S | re.M):
            where = f"{doc.relative_to(ROOT)}:{doc.read_text()[: match.start()].count(chr(10)) + 1}"
            lang, body = match.groups()
            if lang in ("bash", "sh"):
                for line in body.replace("\\\n", " ").splitlines():
                    found += [Shown(where, argv, None) for argv in _commands(line)]
            else:
                for prompt in re.split(r"^\$ ", body, flags=re.M)[1:]:
                    line, _, output = prompt.partition("\n")
                    found += [Shown(where, argv, output) for argv in _commands(line)]
    unique: dict[str, Shown] = {}
    for s in found:  # each command once: where the docs show its output, else where it first appears
        if s.text not in unique or (s.output is not None and unique[s.text].output is None):
            unique[s.text] = s
    return list(unique.values())


COMMANDS = shown_commands()
RUN = [s for s in COMMANDS if s.text not in EXCLUDED]


def torchrun_scenario(index: int, shown: Shown) -> Scenario:
    """`torchrun [options] -m hlat ARGS` as a scenario: N = --nproc_per_node, ARGS as shortened."""
    argv = [*shown.argv, *SHORTENED.get(shown.text, [])]
    options, module, args = argv[1 : argv.index("-m")], argv[argv.index("-m") + 1], argv[argv.index("-m") + 2 :]
    assert module == "hlat", f"{shown.where}: {shown.text}: torchrun of a module other than hlat"
    nproc = int(options[options.index("--nproc_per_node") + 1])
    return Scenario(f"docs-torchrun-{index}", "project/docs_torchrun_worker.py:run", nproc, {"argv": args})


TORCHRUN = {s.text: torchrun_scenario(i, s) for i, s in enumerate(x for x in RUN if x.argv[0] == "torchrun")}
SCENARIOS = list(TORCHRUN.values())
TORCHRUN_RUN = [s for s in RUN if s.text in TORCHRUN]
HLAT_RUN = [s for s in RUN if s.text not in TORCHRUN]


def test_the_tables_name_commands_the_docs_show():
    shown = {s.text for s in COMMANDS}
    assert set(EXCLUDED) <= shown and set(SHORTENED) <= shown, (set(EXCLUDED) | set(SHORTENED)) - shown
    assert any(s.argv[0] == "torchrun" for s in COMMANDS) and len(COMMANDS) > 15  # the extraction works


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A fresh directory with what the docs' commands name as the user's own: my.toml, HF_DIR."""
    cwd = tmp_path_factory.mktemp("docs")
    (cwd / "my.toml").write_text(MY_TOML)
    hf = cwd / "HF_DIR"
    hf.mkdir()
    cfg = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
    save_file(hlat_to_hf(Llama(cfg).state_dict()), str(hf / "model.safetensors"))
    (hf / "config.json").write_text(json.dumps({"model_type": "llama", **hf_config_dict(cfg)}))
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"</s>": 0, "<unk>": 1}, unk_token="<unk>")).save(str(hf / "tokenizer.json"))
    return cwd


def _matches(expected: str, actual: str) -> bool:
    """The docs' output, line by line; "..." is any text, and a line of only "..." any lines."""
    lines = [line.rstrip() for line in expected.strip("\n").splitlines()]
    pattern = "".join(
        r"(?:.*\n)*?" if line.strip() == "..." else re.escape(line).replace(r"\.\.\.", ".*") + r"\n" for line in lines
    )
    actual = "\n".join(line.rstrip() for line in actual.splitlines()) + "\n"
    return re.search(pattern, actual) is not None


@pytest.mark.parametrize("shown", TORCHRUN_RUN, ids=[s.text for s in TORCHRUN_RUN])
def test_documented_torchrun_command_runs_as_written(shown, scenarios: ScenarioResults):
    assert shown.output is None, f"{shown.where}: torchrun output is not compared; show it with `hlat ...`"
    scenarios.path(TORCHRUN[shown.text].name)  # fails with each failing rank's output


# (these run beside the shared launch: they read none of it)
@pytest.mark.parametrize("shown", HLAT_RUN, ids=[s.text for s in HLAT_RUN])
def test_documented_command_runs_as_written(shown, workdir, capsys, monkeypatch):
    argv = [*shown.argv, *SHORTENED.get(shown.text, [])]
    monkeypatch.chdir(workdir)
    assert argv[0] == "hlat", f"{shown.where}: {shown.text}: a command this test does not know how to run"
    try:
        code = main(argv[1:])
    except SystemExit as exit_:  # argparse
        code = exit_.code
    captured = capsys.readouterr()
    output = captured.out + captured.err
    if shown.output is None:
        assert code == 0, f"{shown.where}: {' '.join(argv)} exited {code}:\n{output[-4000:]}"
    else:
        assert _matches(shown.output, output), f"{shown.where}: {' '.join(argv)} printed\n{output}\nnot\n{shown.output}"
