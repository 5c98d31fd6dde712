"""Callbacks a user adds without editing hlat: named in the config by import path, or passed from
Python; each sees the hooks in order, at the right steps."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hlat.config.load import load_config
from hlat.errors import ConfigError
from hlat.metrics.sinks import read_metrics
from hlat.train.callbacks.base import Callback
from hlat.train.trainer import Trainer
from runs import tiny_args

# 4 steps, logged and checkpointed every 2, validation at the last step.
ARGS = ("--train.steps", "4", "--train.log_every", "2", "--checkpoint.every", "2", "--eval.every", "4")
EXPECTED = [
    ("on_start", 0),
    ("on_step_start", 0),
    ("on_step_end", 1),
    ("on_step_start", 1),
    ("on_window", 2),
    ("on_log", 2),
    ("on_checkpoint", 2),
    ("on_step_end", 2),
    ("on_step_start", 2),
    ("on_step_end", 3),
    ("on_step_start", 3),
    ("on_window", 4),
    ("on_log", 4),
    ("on_validation", 4),
    ("on_checkpoint", 4),
    ("on_step_end", 4),
    ("on_end", 4),
]

RECORDER = '''
from hlat.train.callbacks.base import Callback


class Recorder(Callback):
    """Every hook it sees, with the trainer's step; adds a field to each training record."""
    seen = []

    def on_start(self, trainer): self.seen.append(("on_start", trainer.step))
    def on_step_start(self, trainer): self.seen.append(("on_step_start", trainer.step))
    def on_window(self, trainer, losses, skipped): self.seen.append(("on_window", trainer.step))
    def on_log(self, trainer, record):
        self.seen.append(("on_log", trainer.step))
        record["my_field"] = record["step"] * 10
    def on_step_end(self, trainer): self.seen.append(("on_step_end", trainer.step))
    def on_validation(self, trainer, loss): self.seen.append(("on_validation", trainer.step))
    def on_tasks(self, trainer, scores, seconds): self.seen.append(("on_tasks", trainer.step))
    def on_checkpoint(self, trainer, stats): self.seen.append(("on_checkpoint", trainer.step))
    def on_rewind(self, trainer, step): self.seen.append(("on_rewind", step))
    def on_failure(self, trainer, error): self.seen.append(("on_failure", trainer.step))
    def on_end(self, trainer, summary): self.seen.append(("on_end", summary.step))
'''


def test_a_callback_named_in_the_config_sees_every_hook_in_order(small_corpus, tmp_path, monkeypatch):
    (tmp_path / "my_callbacks.py").write_text(RECORDER)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "my.toml"
    config.write_text('preset = "tiny"\n[train]\ncallbacks = ["my_callbacks:Recorder"]\n')
    cfg = load_config(None, config, tiny_args(small_corpus, tmp_path / "run", *ARGS))
    trainer = Trainer(cfg, out=lambda _: None)
    (recorder,) = [c for c in trainer.callbacks if type(c).__name__ == "Recorder"]
    trainer.fit()
    assert recorder.seen == EXPECTED
    records = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert [(r["step"], r["my_field"]) for r in records] == [(2, 20), (4, 40)]  # fields it adds are written


def test_a_python_callback_sees_every_hook_in_order_and_the_failure(small_corpus, tmp_path):
    class Recorder(Callback):
        def __init__(self) -> None:
            self.seen: list[tuple[str, int]] = []

        def __getattribute__(self, name):
            if name.startswith("on_"):
                return lambda trainer, *args: self.seen.append((name, trainer.step))
            return super().__getattribute__(name)

    recorder = Recorder()
    Trainer(
        load_config("tiny", None, tiny_args(small_corpus, tmp_path / "run", *ARGS)),
        out=lambda _: None,
        callbacks=[recorder],
    ).fit()
    assert recorder.seen == EXPECTED

    class Stop(Callback):
        def on_step_end(self, trainer):
            if trainer.step == 1:
                raise KeyboardInterrupt

    failing = Recorder()
    with pytest.raises(KeyboardInterrupt):
        Trainer(
            load_config("tiny", None, tiny_args(small_corpus, tmp_path / "stopped", *ARGS)),
            out=lambda _: None,
            callbacks=[Stop(), failing],
        ).fit()
    assert failing.seen == [("on_start", 0), ("on_step_start", 0), ("on_failure", 1)]


@pytest.mark.parametrize(
    "path, problem",
    [
        ("my_callbacks.Recorder", "'my_callbacks.Recorder' is not an import path; write 'package.module:ClassName'"),
        (
            "no_such_module:Recorder",
            "'no_such_module:Recorder' does not import (ModuleNotFoundError: No module named "
            "'no_such_module'); put its package on PYTHONPATH or install it",
        ),
        (
            "json:dumps",
            "'json:dumps' names function, not a subclass of hlat.train.callbacks.base.Callback; name such a class",
        ),
        ("json:Nothing", "'json:Nothing' names nothing, not a subclass"),
        ("json:JSONDecoder", "'json:JSONDecoder' names class JSONDecoder, not a subclass"),
    ],
)
def test_a_callback_path_that_does_not_name_a_callback_is_a_configuration_error(small_corpus, tmp_path, path, problem):
    cfg = load_config("tiny", None, tiny_args(small_corpus, tmp_path / "run", "--train.callbacks", path))
    with pytest.raises(ConfigError) as err:
        Trainer(cfg, out=lambda _: None)
    assert [field for field, _ in err.value.problems] == ["train.callbacks"]
    assert problem in str(err.value) and len(str(err.value).splitlines()) == 2  # the heading and one line
    assert not (tmp_path / "run").exists()  # refused before anything is built


def test_python_m_hlat_imports_no_callback_from_the_working_directory(small_corpus, tmp_path):
    """`python -m hlat` puts the working directory on sys.path, the console script does not: a
    config handed to `hlat train` must not run a module that merely lies where hlat was started;
    one on PYTHONPATH does import."""
    (tmp_path / "planted.py").write_text("open('imported', 'w').close()\nraise RuntimeError('planted')\n")
    (tmp_path / "run.toml").write_text('preset = "tiny"\n[train]\ncallbacks = ["planted:Recorder"]\n')
    argv = [sys.executable, "-m", "hlat", "train", "--config", "run.toml", *tiny_args(small_corpus, tmp_path / "run")]
    # the caller's entries (an empty one would name the working directory), after which hlat imports
    pythonpath = os.pathsep.join(entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry)

    def train(path: str) -> str:
        env = {**os.environ, "PYTHONPATH": path, "HLAT_DEBUG": "0"}
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        return done.stderr

    assert "'planted:Recorder' does not import (ModuleNotFoundError" in train(pythonpath)
    assert not (tmp_path / "imported").exists()
    assert "'planted:Recorder' does not import (RuntimeError: planted)" in train(f"{tmp_path}{os.pathsep}{pythonpath}")
    assert (tmp_path / "imported").exists()
