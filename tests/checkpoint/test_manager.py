import hashlib
import json
import os
import pickle
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hlat.checkpoint import CheckpointError, CheckpointManager
from hlat.checkpoint.manager import own_files


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


def _save_on_two_ranks(rank: int, directory: str, port: int) -> None:
    """Worker: a synchronous save (step 1) and a background one (step 2) by 2 gloo processes."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mgr = CheckpointManager(Path(directory), keep_last=None)
    for step, background in ((1, False), (2, True)):
        sharded = {"model": {f"w{rank}": torch.full((1000,), float(10 * step + rank))}}  # each rank its own tensor
        mgr.save(step, sharded, {"loader": {"rank": rank}}, {"progress": {"step": step}} if rank == 0 else None,
                 background=background)
    mgr.wait()
    for path in mgr.checkpoints():  # the DCP files this rank hashed are the ones it wrote
        assert [p.name for p in own_files(path, rank)] == [f"rank_{rank:05d}.pt", f"__{rank}_0.distcp"]
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # skip interpreter teardown, which can race gloo's threads


def test_two_ranks_hash_their_own_files_sync_and_async(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_save_on_two_ranks, args=(str(tmp_path), port), nprocs=2, join=True)
    mgr = CheckpointManager(tmp_path, keep_last=None)
    assert [p.name for p in mgr.checkpoints()] == ["step_00000001", "step_00000002"]
    for path in mgr.checkpoints():
        manifest = mgr.check(path)
        assert manifest["world"] == 2
        on_disk = {str(f.relative_to(path)) for f in path.rglob("*") if f.is_file()} - {"manifest.json"}
        assert set(manifest["files"]) == on_disk == {"rank_00000.pt", "rank_00001.pt", "shared.pt", "dcp/.metadata",
                                                     "dcp/__0_0.distcp", "dcp/__1_0.distcp"}
        for name, entry in manifest["files"].items():
            data = (path / name).read_bytes()
            assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    target = {"model": {"w0": torch.zeros(1000), "w1": torch.zeros(1000)}}
    mgr.load_sharded(mgr.latest(), target)
    assert target["model"]["w1"][0].item() == 21.0
    shard = tmp_path / "step_00000002" / "dcp" / "__1_0.distcp"  # rank 1's data of the newest checkpoint
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert mgr.latest().name == "step_00000001"
    assert "dcp/__1_0.distcp fails its SHA-256 check" in capsys.readouterr().out
