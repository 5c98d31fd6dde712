"""No write follows a symbolic link planted where hlat writes (hlat.atomic_files): each link is
refused (SymlinkRefused, one line, exit 2) or replaced, and its target is never written."""

import pytest
import torch

from hlat.atomic_files import SymlinkRefused, make_dir
from hlat.checkpoint.errors import CheckpointError
from hlat.checkpoint.manager import MANIFEST, CheckpointManager
from hlat.cli import USER_ERROR_EXIT, main
from hlat.eval.results import write_results
from hlat.metrics.sinks import JsonlSink
from runs import tiny_args


@pytest.fixture
def victim(tmp_path):
    """A user's directory and file that a planted link points at: they must stay as they are."""
    directory = tmp_path / "victim"
    directory.mkdir()
    (directory / "data.txt").write_text("the user's data\n")
    yield directory
    assert sorted(p.name for p in directory.iterdir()) == ["data.txt"]
    assert (directory / "data.txt").read_text() == "the user's data\n"


def _save(manager: CheckpointManager, step: int) -> None:
    manager.save(step, {"model": {"w": torch.arange(4.0)}}, {"rng": 1}, {"progress": {"step": step}})


def test_checkpoint_staging_and_final_links_are_replaced(tmp_path, victim):
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / ".tmp-step_00000001").symlink_to(victim)  # the staging directory of the next save
    (checkpoints / "step_00000002").symlink_to(victim)  # a committed name
    manager = CheckpointManager(checkpoints, keep_last=None)
    _save(manager, 1)
    _save(manager, 2)
    for step in (1, 2):
        final = checkpoints / f"step_{step:08d}"
        assert not final.is_symlink() and (final / MANIFEST).is_file()
        manager.check(final)
    (tmp_path / "run" / "elsewhere").symlink_to(victim)
    with pytest.raises(CheckpointError, match="SymlinkRefused.*symbolic link"):  # checkpoints/ itself
        CheckpointManager(tmp_path / "run" / "elsewhere", keep_last=None).save(3, {"w": torch.zeros(1)}, None, None)


def test_metrics_results_and_folders_refuse_links(tmp_path, victim):
    (tmp_path / "metrics.jsonl").symlink_to(victim / "data.txt")
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    with pytest.raises(SymlinkRefused, match="metrics.jsonl"):
        sink.log({"step": 1, "loss": 1.0})
    with pytest.raises(SymlinkRefused, match="metrics.jsonl"):
        sink.rewind(0)  # the rewrite of a resumed run
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "results.json").symlink_to(victim / "data.txt")
    with pytest.raises(SymlinkRefused, match="results.json"):
        write_results(tmp_path / "eval", {"tasks": {}}, [])
    (tmp_path / "tensorboard").symlink_to(victim)
    with pytest.raises(SymlinkRefused, match="tensorboard"):
        make_dir(tmp_path / "tensorboard")


def test_train_refuses_a_linked_config_toml(tmp_path, small_corpus, victim, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").symlink_to(victim / "data.txt")
    assert main(["train", *tiny_args(small_corpus, run, "--train.steps", "1")]) == USER_ERROR_EXIT
    err = capsys.readouterr().err
    assert f"refusing to write through the symbolic link {run / 'config.toml'}" in err
    assert len(err.strip().splitlines()) == 1, err
    (run / "config.toml").unlink()
    (run / "metrics.jsonl").symlink_to(victim / "data.txt")
    assert main(["train", *tiny_args(small_corpus, run, "--train.steps", "1")]) == USER_ERROR_EXIT
    assert "metrics.jsonl" in capsys.readouterr().err
