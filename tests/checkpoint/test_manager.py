import hashlib
import json
import pickle

import pytest
import torch

from hlat.checkpoint.errors import CheckpointError
from hlat.checkpoint.manager import CheckpointManager
from hlat.checkpoint.restore import rank_state_for
from manager_runs import FAULTS
from runs import Scenario


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
    (tmp_path / ".tmp-step_00000003" / "dcp").mkdir(parents=True)  # a save killed before its rename
    (tmp_path / ".tmp-step_00000003" / "dcp" / "__0_0.distcp").write_bytes(b"torn")
    (tmp_path / ".tmp-step_00000009").mkdir()  # one of a step the next save does not reuse
    (tmp_path / ".tmp-step_00000009" / "rank_00000.pt").write_bytes(b"torn")
    assert mgr.latest().name == "step_00000001"
    # the next save removes every stale temporary directory and commits only its own files
    committed = save(mgr, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001", "step_00000002", "step_00000003"]
    assert mgr.latest() == committed and (committed / "dcp" / "__0_0.distcp").read_bytes() != b"torn"


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


SAVES, FAULTY = "checkpoint-two-rank-saves", "checkpoint-save-faults"
SCENARIOS = [
    Scenario(SAVES, "checkpoint/manager_runs.py:saves_and_shared_verification", 2),
    Scenario(FAULTY, "checkpoint/manager_runs.py:save_faults", 2),
]


def test_two_ranks_hash_their_own_files_sync_and_async(scenarios):
    directory = scenarios.path(SAVES) / "checkpoints"
    mgr = CheckpointManager(directory, keep_last=None)
    assert [p.name for p in mgr.checkpoints()] == ["step_00000001", "step_00000002"]
    for rank in (0, 1):  # the DCP files each rank hashed at save time are the ones it wrote
        own = scenarios.json(SAVES, f"result.rank{rank}.json")["own"]
        assert own == {
            step: [f"rank_{rank:05d}.pt", f"__{rank}_0.distcp"] for step in ("step_00000001", "step_00000002")
        }
    for path in mgr.checkpoints():
        manifest = mgr.check(path)
        assert manifest["world"] == 2
        on_disk = {str(f.relative_to(path)) for f in path.rglob("*") if f.is_file()} - {"manifest.json"}
        assert (
            set(manifest["files"])
            == on_disk
            == {"rank_00000.pt", "rank_00001.pt", "shared.pt", "dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp"}
        )
        for name, entry in manifest["files"].items():
            data = (path / name).read_bytes()
            assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    target = {"model": {"w0": torch.zeros(1000), "w1": torch.zeros(1000)}}
    mgr.load_sharded(mgr.latest(), target)
    assert target["model"]["w0"][0].item() == 20.0 and target["model"]["w1"][0].item() == 21.0


def test_resume_verification_is_shared_and_agreed(scenarios):
    """Each rank hashes its own files and a share of the rest; a shard that only rank 1 checks
    is corrupt: both ranks skip that checkpoint."""
    results = [scenarios.json(SAVES, f"result.rank{rank}.json") for rank in (0, 1)]
    assert [r["clean"] for r in results] == ["step_00000002"] * 2
    hashed = [set(r["hashed"]) for r in results]
    assert {"rank_00000.pt", "dcp/__0_0.distcp"} <= hashed[0] and {"rank_00001.pt", "dcp/__1_0.distcp"} <= hashed[1]
    assert not hashed[0] & hashed[1]  # nothing is hashed twice
    assert hashed[0] | hashed[1] == {
        "rank_00000.pt",
        "rank_00001.pt",
        "shared.pt",
        "dcp/.metadata",
        "dcp/__0_0.distcp",
        "dcp/__1_0.distcp",
    }
    assert [r["fallback"] for r in results] == ["step_00000001"] * 2
    assert "step_00000002: rank 1: dcp/__1_0.distcp fails its SHA-256 check" in results[0]["printed"]
    assert results[1]["printed"] == ""  # rank 0 alone reports


def test_a_failed_save_step_raises_on_every_rank(scenarios):
    """An injected OSError in one of hlat's save steps on one rank (HLAT_FAULT=fail-*) raises
    CheckpointError on both ranks at once, naming the failing rank and its error; the next save
    commits. Left uncaught, it ends the scenario on both ranks with that message."""
    out = scenarios.root / FAULTY
    results = [json.loads((out / f"result.rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank_results in results:
        assert [(r["fault"], r["rank"]) for r in rank_results["faults"]] == [(f, r) for f, r, _ in FAULTS]
        for case in rank_results["faults"]:
            assert case["error"] and f"rank {case['rank']}: failed" in case["error"], case
            assert f"injected fault {case['fault']} (HLAT_FAULT)" in case["error"], case
            assert case["seconds"] < 60, case  # at once, not after a collective timeout (30 min by default)
        assert rank_results["committed"] == [f"step_{len(FAULTS) + 1:08d}"]
    for rank in (0, 1):
        error = (out / f"error.rank{rank}.txt").read_text()
        assert "CheckpointError: rank 1: failed to hash its files" in error and "injected fault fail-hash" in error


def test_rank_files_the_manifest_does_not_list_are_refused(tmp_path):
    """A resharded resume reads every saved rank's loader state: only files the manifest lists
    (and verification checked) count; one copied in is refused, not read unverified."""
    mgr = CheckpointManager(tmp_path, keep_last=None)
    path = mgr.save(1, {"model": {"w": torch.zeros(4)}}, {"loader": {"dp_rank": 0, "dp_size": 1}, "rng": None}, {}).path
    assert rank_state_for(mgr, path, 0, 0, 1, same_layout=False)[0]["dp_rank"] == 0  # the listed file alone
    torch.save({"loader": {"dp_rank": 1, "dp_size": 1}, "rng": None}, path / "rank_00001.pt")
    with pytest.raises(CheckpointError, match="holds files its manifest does not list: rank_00001.pt"):
        mgr.check(path)  # the manifest's files are all intact: verification sees the stranger too
    for same_layout in (False, True):
        with pytest.raises(CheckpointError, match="holds rank_00001.pt, which its manifest does not list"):
            rank_state_for(mgr, path, 0, 0, 1, same_layout)
