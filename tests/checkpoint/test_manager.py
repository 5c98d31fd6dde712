import json
import pickle

import pytest
import torch

from hlat.checkpoint import CheckpointError, CheckpointManager


def save(mgr: CheckpointManager, step: int):
    sharded = {"model": {"w": torch.full((4,), float(step))}}
    return mgr.save(step, sharded, {"loader": {"cursor": step}}, {"progress": {"step": step}}).path


def test_round_trip_and_retention(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        save(mgr, step)
    assert [p.name for p in mgr.checkpoints()] == ["step_00000002", "step_00000003"]
    path = mgr.latest()
    assert path.name == "step_00000003"
    target = {"model": {"w": torch.zeros(4)}}
    mgr.load_sharded(path, target)
    assert torch.equal(target["model"]["w"], torch.full((4,), 3.0))
    assert mgr.load_rank_state(path, 0) == {"loader": {"cursor": 3}}
    assert mgr.load_rank_state(path, 1) is None
    assert mgr.load_shared(path)["progress"]["step"] == 3


def test_corrupt_newest_falls_back_to_previous(tmp_path, capsys):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    save(mgr, 1)
    newest = save(mgr, 2)
    shard = next((newest / "dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # flip one byte: same size, wrong checksum
    shard.write_bytes(bytes(data))
    assert mgr.latest().name == "step_00000001"
    assert "SHA-256" in capsys.readouterr().out


def test_truncated_and_uncommitted_saves_are_ignored(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    save(mgr, 1)
    newest = save(mgr, 2)
    (newest / "rank_00000.pt").write_bytes((newest / "rank_00000.pt").read_bytes()[:10])
    (tmp_path / ".tmp-step_00000003").mkdir()  # a save killed before its rename
    assert mgr.latest().name == "step_00000001"


class _Evil:
    def __reduce__(self):
        return (print, ("executed",))


def _rewrite_manifest(path) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        entry["bytes"] = (path / name).stat().st_size
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_pickled_code_is_refused_in_pt_files(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=1, verify=False)
    path = save(mgr, 1)
    torch.save({"x": _Evil()}, path / "shared.pt")
    _rewrite_manifest(path)
    with pytest.raises(CheckpointError, match="cannot load"):
        mgr.load_shared(path)


def test_pickled_code_is_refused_in_dcp_metadata(tmp_path, capsys):
    mgr = CheckpointManager(tmp_path, keep_last=1, verify=False)
    path = save(mgr, 1)
    (path / "dcp" / ".metadata").write_bytes(pickle.dumps(_Evil()))
    _rewrite_manifest(path)
    assert mgr.latest() is None  # refused before DCP would unpickle it
    out = capsys.readouterr().out
    assert "refusing to load builtins.print" in out and "executed" not in out
