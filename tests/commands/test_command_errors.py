"""Every command's bad arguments end it the same way: one line `hlat COMMAND: message` on stderr,
nothing on stdout, exit code 2, no traceback; whether argparse refuses them, the command does, or
the command takes no `--section.field` overrides."""

import subprocess
import sys

import pytest

from hlat.cli import USER_ERROR_EXIT, main

CASES = {
    "no command": ([], "hlat: the following arguments are required: COMMAND; see hlat --help"),
    "unknown command": (["trian"], "hlat: argument COMMAND: invalid choice: 'trian'"),
    "train": (["train", "--resume", "--fresh"], "hlat train: argument --fresh: not allowed with argument --resume"),
    "config": (["config", "--preset"], "hlat config: argument --preset: expected one argument"),
    "presets": (["presets", "--train.steps", "3"], "hlat presets: unrecognized arguments: --train.steps 3"),
    "params": (["params", "--config"], "hlat params: argument --config: expected one argument"),
    "plan": (["plan"], "hlat plan: --world is required: the number of ranks to plan for, e.g. --world 64"),
    "plan memory": (
        ["plan", "--world", "8", "--peak-tflops", "100", "--memory-gib", "0"],
        "hlat plan: --memory-gib must be a finite number > 0, got 0.0",
    ),
    "plan tokens": (
        ["plan", "--world", "8", "--tokens", "-5"],
        "hlat plan: --tokens must be a finite number > 0, got -5.0",
    ),
    "plan efficiency": (
        ["plan", "--world", "8", "--efficiency", "nan"],
        "hlat plan: --efficiency must be a finite number > 0, got nan",
    ),
    "plan per node": (
        ["plan", "--world", "8", "--per-node", "0"],
        "hlat plan: --per-node must be a finite number >= 1, got 0",
    ),
    "prepare": (["prepare"], "hlat prepare: the following arguments are required: --out"),
    "prepare mixture": (
        ["prepare", "--out", "{tmp}/shards", "--data.source", "{tmp}/a.jsonl,{tmp}/b.jsonl"],
        "hlat prepare: give one data.source (prepare each source of a mixture into its own directory)",
    ),
    "tokenizer": (
        ["tokenizer", "train", "x", "--vocab-size", "many", "--out", "t.json"],
        "hlat tokenizer train: argument --vocab-size: invalid int value: 'many'",
    ),
    "tokenizer extra": (
        ["tokenizer", "train", "x", "--vocab-size", "300", "--out", "t.json", "--data.seq_len", "8"],
        "hlat tokenizer: unrecognized arguments: --data.seq_len 8",
    ),
    "eval": (
        ["eval", "--checkpoint", "{tmp}", "--tasks", "arc_easy", "--shots", "5"],
        "hlat eval: unrecognized arguments: --shots 5; see hlat eval --help",
    ),
    "export": (
        ["export", "{tmp}", "{tmp}/hf", "--dtype", "float8"],
        "hlat export: --dtype 'float8': choose one of float32, bfloat16, float16",
    ),
    "export extra": (
        ["export", "{tmp}", "{tmp}/hf", "--force"],
        "hlat export: unrecognized arguments: --force",
    ),
    "import": (["import", "{tmp}", "{tmp}/run", "--overwrite"], "hlat import: unrecognized arguments: --overwrite"),
    "generate": (
        ["generate", "--checkpoint", "{tmp}", "--prompt", "x", "--top-p", "0"],
        "hlat generate: --top-p must be in (0, 1], got 0.0",
    ),
    "generate temperature": (
        ["generate", "--checkpoint", "{tmp}", "--prompt", "x", "--temperature", "nan"],
        "hlat generate: --temperature must be a finite number >= 0 (0 = greedy), got nan",
    ),
    "generate negative temperature": (
        ["generate", "--checkpoint", "{tmp}", "--prompt", "x", "--temperature", "-1"],
        "hlat generate: --temperature must be a finite number >= 0 (0 = greedy), got -1.0",
    ),
    "eval output": (
        ["eval", "--checkpoint", "{tmp}", "--tasks", "arc_easy", "--output", "{tmp}/a.jsonl"],
        "hlat eval: --output {tmp}/a.jsonl exists and is not a folder",
    ),
    "doctor": (["doctor", "--timeout", "soon"], "hlat doctor: argument --timeout: invalid float value: 'soon'"),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_arguments_print_one_line_and_exit_2(name, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HLAT_DEBUG", raising=False)
    for part in "ab":
        (tmp_path / f"{part}.jsonl").write_text('{"text": "a document"}\n')
    argv, message = CASES[name]
    message = message.format(tmp=tmp_path)
    assert main([arg.format(tmp=tmp_path) for arg in argv]) == USER_ERROR_EXIT
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(message) and captured.err.count("\n") == 1, captured.err


def test_the_program_exits_2_on_an_argument_argparse_refuses():
    done = subprocess.run(
        [sys.executable, "-m", "hlat", "train", "--resume", "--fresh"], capture_output=True, text=True
    )
    assert done.returncode == USER_ERROR_EXIT and done.stdout == ""
    assert done.stderr == ("hlat train: argument --fresh: not allowed with argument --resume; see hlat train --help\n")
