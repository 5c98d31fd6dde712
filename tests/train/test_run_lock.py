"""One trainer per run directory (hlat.train.run_lock): a second one is refused naming the holder,
a holder killed with SIGKILL blocks nothing, and readers (export, eval's loader) need no lock."""

import os
import signal
import socket
import subprocess
import sys

from hlat.checkpoint.loading import load_model
from hlat.cli import USER_ERROR_EXIT, main
from hlat.train.run_lock import LOCK_FILE, RunDirLock
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
