"""One trainer per run directory (hlat.train.run_lock): a second one is refused naming the holder,
a holder killed with SIGKILL blocks nothing, readers (export, eval's loader) need no lock, and a
holder whose lock file was deleted stops before its next checkpoint and removes nobody else's."""

import errno
import fcntl
import os
import signal
import socket
import subprocess
import sys

import pytest

from hlat.checkpoint.loading import load_model
from hlat.cli import USER_ERROR_EXIT, main
from hlat.config.load import load_config
from hlat.errors import UserError
from hlat.train.callbacks.base import Callback
from hlat.train.run_lock import LOCK_FILE, RunDirLock, RunDirLocked
from hlat.train.trainer import Trainer
from runs import tiny_args


def test_second_trainer_is_refused_naming_the_holder(tmp_path, small_corpus, capsys):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(small_corpus, run, "--train.steps", "1")]) == 0
    assert not (run / LOCK_FILE).exists()  # released, and removed, when the run ended
    held = RunDirLock.acquire(run)
    try:
        capsys.readouterr()
        assert main(["train", *tiny_args(small_corpus, run, "--train.steps", "2")]) == USER_ERROR_EXIT
        err = capsys.readouterr().err
        assert f"is in use by the run of host {socket.gethostname()} pid {os.getpid()}" in err, err
        assert "another --train.run_dir" in err and len(err.strip().splitlines()) == 1
        # readers take no lock: export and eval's loader read the run while it is held
        assert main(["export", str(run), str(tmp_path / "hf")]) == 0
        assert load_model(run).step == 1
    finally:
        held.release()
    assert main(["train", *tiny_args(small_corpus, run, "--train.steps", "2")]) == 0


def test_lock_of_a_killed_holder_does_not_block(tmp_path):
    run = tmp_path / "run"
    code = (
        "import os, signal, sys; from hlat.train.run_lock import RunDirLock; "
        "RunDirLock.acquire(sys.argv[1]); os.kill(os.getpid(), signal.SIGKILL)"
    )
    killed = subprocess.run(
        [sys.executable, "-c", code, str(run)], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    )
    assert killed.returncode == -signal.SIGKILL
    assert " pid " in (run / LOCK_FILE).read_text()  # the file stays behind, unlocked
    RunDirLock.acquire(run).release()
    assert run.is_dir() and not (run / LOCK_FILE).exists()


def test_a_deleted_lock_lets_nobody_share_the_run_unseen(tmp_path):
    """A user deletes the lock of a running trainer: a second trainer gets in, but the first one's
    release leaves the second's file alone, and the first sees it lost the lock."""
    run = tmp_path / "run"
    first = RunDirLock.acquire(run)
    (run / LOCK_FILE).unlink()
    second = RunDirLock.acquire(run)
    with pytest.raises(RunDirLocked, match="is no longer this run's lock"):
        first.check()
    second.check()
    first.release()
    assert (run / LOCK_FILE).is_file()  # still the second's
    second.check()
    second.release()
    assert not (run / LOCK_FILE).exists()


class _DeleteTheLock(Callback):
    def on_step_end(self, trainer) -> None:  # type: ignore[no-untyped-def]
        if trainer.step == 1:
            (trainer.run_dir / LOCK_FILE).unlink()


def test_a_trainer_that_lost_its_lock_stops_before_writing(tmp_path, small_corpus):
    run = tmp_path / "run"
    cfg = load_config("tiny", None, tiny_args(small_corpus, run, "--train.steps", "4", "--checkpoint.every", "2"))
    trainer = Trainer(cfg, resume="fresh", out=lambda _: None, callbacks=[_DeleteTheLock()])
    with pytest.raises(UserError, match="is no longer this run's lock .* stopped before writing a checkpoint"):
        trainer.fit()
    assert not list((run / "checkpoints").glob("*step_*"))  # nothing written, not even a temporary directory


def test_a_file_system_without_locks_is_one_line(tmp_path, monkeypatch):
    def unsupported(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", unsupported)
    lines: list[str] = []
    RunDirLock.acquire(tmp_path / "run", lines.append).release()
    assert len(lines) == 1 and "cannot lock files" in lines[0] and "make sure none does" in lines[0]
