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
