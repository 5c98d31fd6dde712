"""A save that meets a full disk ends in one line saying so, naming the checkpoint it was
writing and the previous one, which stays intact and resumable (hlat.checkpoint.manager)."""

import errno
import io

import pytest
import torch
import torch.distributed.checkpoint.filesystem as dcp_filesystem

from hlat.checkpoint.errors import CheckpointError
from hlat.checkpoint.manager import CheckpointManager


def _save(manager: CheckpointManager, step: int) -> None:
    manager.save(step, {"model": {"w": torch.full((64,), float(step))}}, {"rng": step}, {"progress": {"step": step}})


class _FullDisk(io.RawIOBase):
    """A file whose disk fills after 100 bytes."""

    def __init__(self, handle: io.BufferedWriter):
        self.handle, self.written = handle, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.written += len(data)
        if self.written > 100:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.handle.write(data)


def _torch_save_on_a_full_disk(monkeypatch):
    real = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, handle: real(obj, _FullDisk(handle)))  # torch's own error


def _dcp_write_on_a_full_disk(monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp_filesystem, "_write_item", full)


@pytest.mark.parametrize("fill", [_torch_save_on_a_full_disk, _dcp_write_on_a_full_disk], ids=["rank-file", "dcp"])
def test_full_disk_is_one_line_and_the_previous_step_survives(tmp_path, monkeypatch, fill):
    manager = CheckpointManager(tmp_path, keep_last=2)
    _save(manager, 1)
    fill(monkeypatch)
    with pytest.raises(CheckpointError) as raised:
        _save(manager, 2)
    message = str(raised.value)
    assert "no space left on device" in message and str(tmp_path / ".tmp-step_00000002") in message, message
    assert f"{tmp_path / 'step_00000001'} is intact and a resume starts from it" in message, message
    assert "\n" not in message and "unexpected pos" not in message
    monkeypatch.undo()
    assert manager.latest() == tmp_path / "step_00000001"
    target = {"model": {"w": torch.zeros(64)}}
    manager.load_sharded(manager.latest(), target)
    assert torch.equal(target["model"]["w"], torch.full((64,), 1.0))
    _save(manager, 2)  # space freed: the next save sweeps the partial one and commits
    assert [p.name for p in manager.checkpoints()] == ["step_00000001", "step_00000002"]


def test_a_full_disk_under_metrics_jsonl_saves_the_next_step_and_stops_in_one_line(
    small_corpus, tmp_path, capsys, monkeypatch
):
    """metrics.jsonl's disk fills at step 2's record: the run trains to the next step boundary,
    saves it, and stops in one line saying which file and where the resume starts (exit 2)."""
    from hlat.cli import main
    from hlat.metrics import sinks
    from runs import tiny_args

    real = sinks.append_text

    def fills(path, text: str) -> None:  # type: ignore[no-untyped-def]
        if '"step": 2' in text or '"step": 3' in text:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, text)

    monkeypatch.setattr(sinks, "append_text", fills)
    run = tmp_path / "run"
    args = tiny_args(small_corpus, run, "--train.steps", "6", "--checkpoint.every", "100")
    capsys.readouterr()
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"hlat train: stopped: disk full writing {run / 'metrics.jsonl'}: no space left on device; free space "
        "there; saved step 3; run the same command to resume from step 3"
    ), err
    assert [p.name for p in CheckpointManager(run / "checkpoints", None).checkpoints()] == ["step_00000003"]
    monkeypatch.setattr(sinks, "append_text", real)
    assert main(["train", *args]) == 0  # the space is back: the resume trains steps 4 to 6
