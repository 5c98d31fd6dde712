import json

import pytest
import torch

from hlat.checkpoint import CheckpointError, CheckpointManager


def state(v: float) -> dict:
    return {"w": torch.full((4,), v), "progress": {"step": int(v), "tokens": 10}, "names": ["a", "b"]}


def test_round_trip_and_retention(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        mgr.save(step, state(step))
    assert [p.name for p in mgr.checkpoints()] == ["step_00000002", "step_00000003"]
    path, loaded = mgr.load_latest()
    assert path.name == "step_00000003"
    assert torch.equal(loaded["w"], torch.full((4,), 3.0)) and loaded["names"] == ["a", "b"]


def test_corrupt_newest_falls_back_to_previous(tmp_path, capsys):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    mgr.save(1, state(1))
    newest = mgr.save(2, state(2))
    data = bytearray((newest / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # flip one byte: same size, wrong checksum
    (newest / "state.pt").write_bytes(bytes(data))
    path, loaded = mgr.load_latest()
    assert path.name == "step_00000001" and loaded["progress"]["step"] == 1
    assert "SHA-256" in capsys.readouterr().out


def test_truncated_and_uncommitted_saves_are_ignored(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    mgr.save(1, state(1))
    newest = mgr.save(2, state(2))
    (newest / "state.pt").write_bytes((newest / "state.pt").read_bytes()[:100])
    (tmp_path / ".tmp-step_00000003-1").mkdir()  # a save killed before its rename
    path, _ = mgr.load_latest()
    assert path.name == "step_00000001"


def test_pickled_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("executed",))

    mgr = CheckpointManager(tmp_path, keep_last=1, verify=False)
    path = mgr.save(1, state(1))
    torch.save({"x": Evil()}, path / "state.pt")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["state.pt"]["bytes"] = (path / "state.pt").stat().st_size
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="cannot load"):
        mgr.load(path)
