"""A run never restarts silently: when no checkpoint of a run directory passes verification
(corrupt, incomplete, another format), `hlat train` stops and names each one with why; retention
never deletes a checkpoint that verified in favour of one that did not; and every file a
checkpoint holds must be in its manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hlat import __version__
from hlat.checkpoint import manager
from hlat.cli import main
from runs import tiny_args

STEP = "step_{:08d}"


def _train(corpus: Path, run: Path, steps: int, *extra: str) -> int:
    args = tiny_args(corpus, run, "--train.steps", str(steps), "--checkpoint.every", "2", *extra)
    return main(["train", *args])


@pytest.fixture(scope="module")
def trained(small_corpus, tmp_path_factory) -> dict[int, Path]:
    """Runs of 2 and of 4 steps (checkpoints every 2, the last two kept), trained once: each test
    damages a copy."""
    runs = {}
    for steps in (2, 4):
        runs[steps] = tmp_path_factory.mktemp("trained") / "run"
        assert _train(small_corpus, runs[steps], steps, "--checkpoint.keep_last", "2") == 0
    return runs


def _copy(trained: dict[int, Path], steps: int, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained[steps], run)
    return run


def _manifest(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "manifest.json").read_text())


def _flip_a_byte(checkpoint: Path) -> None:
    shard = next((checkpoint / "dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def _list_a_missing_file(checkpoint: Path) -> None:
    manifest = _manifest(checkpoint)
    manifest["files"]["dcp/__9_0.distcp"] = {"bytes": 1, "sha256": "0" * 64}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


def _another_format(checkpoint: Path) -> None:
    manifest = _manifest(checkpoint)
    manifest["format"] = manifest["format"] + 1
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "damage, why",
    [
        (_flip_a_byte, "fails its SHA-256 check"),
        (_list_a_missing_file, "missing dcp/__9_0.distcp"),
        (_another_format, f"and hlat {__version__} reads format {manager.FORMAT_VERSION}"),
    ],
)
def test_a_run_whose_checkpoints_all_fail_stops_naming_each(small_corpus, trained, tmp_path, capsys, damage, why):
    run = _copy(trained, 4, tmp_path)
    metrics = (run / "metrics.jsonl").read_text()
    for step in (2, 4):
        damage(run / "checkpoints" / STEP.format(step))
    capsys.readouterr()
    assert _train(small_corpus, run, 6) == 2
    err = capsys.readouterr().err
    assert "no checkpoint passes verification, so this run cannot resume" in err, err
    assert f"  {STEP.format(4)}: " in err and f"  {STEP.format(2)}: " in err and why in err, err
    assert "--fresh" in err and "repair" in err, err
    assert (run / "metrics.jsonl").read_text() == metrics  # nothing rewritten
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [STEP.format(2), STEP.format(4)]


def test_retention_keeps_the_checkpoint_that_verified(small_corpus, trained, tmp_path, capsys):
    run = _copy(trained, 4, tmp_path)
    _flip_a_byte(run / "checkpoints" / STEP.format(4))
    capsys.readouterr()
    assert _train(small_corpus, run, 6, "--checkpoint.keep_last", "1") == 0
    out = capsys.readouterr()
    rejected = run / "checkpoints" / manager.REJECTED_DIR / STEP.format(4)
    assert f"moved {run / 'checkpoints' / STEP.format(4)} aside to {rejected}" in out.out + out.err
    assert f"resuming from {run / 'checkpoints' / STEP.format(2)}" in out.out
    kept = manager.CheckpointManager(run / "checkpoints", 1)
    assert [p.name for p in kept.checkpoints()] == [STEP.format(6)]
    kept.check(kept.checkpoints()[0])
    assert rejected.is_dir()


@pytest.mark.parametrize("planted", ["unlisted", "extra"])
def test_every_file_a_checkpoint_holds_is_in_its_manifest(small_corpus, trained, tmp_path, capsys, planted):
    """Weights overwritten and their manifest entry removed, or a file planted beside them: the
    checkpoint fails verification instead of loading the file unverified."""
    run = _copy(trained, 2, tmp_path)
    checkpoint = run / "checkpoints" / STEP.format(2)
    manifest = _manifest(checkpoint)
    if planted == "unlisted":
        shard = next((checkpoint / "dcp").glob("*.distcp"))
        shard.write_bytes(b"\x00" * shard.stat().st_size)
        del manifest["files"][f"dcp/{shard.name}"]
        (checkpoint / "manifest.json").write_text(json.dumps(manifest))
        why = f"holds files its manifest does not list: dcp/{shard.name}"
    else:
        (checkpoint / "rank_00007.pt").write_bytes(b"planted")
        why = "holds files its manifest does not list: rank_00007.pt"
    capsys.readouterr()
    assert _train(small_corpus, run, 4) == 2
    assert why in capsys.readouterr().err


def test_a_manifest_must_list_every_file_the_checkpoint_needs(small_corpus, trained, tmp_path, capsys):
    run = _copy(trained, 2, tmp_path)
    checkpoint = run / "checkpoints" / STEP.format(2)
    manifest = _manifest(checkpoint)
    shard = next((checkpoint / "dcp").glob("*.distcp"))
    shard.unlink()
    del manifest["files"][f"dcp/{shard.name}"]
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert _train(small_corpus, run, 4) == 2
    assert f"does not list dcp/{shard.name}, which the checkpoint needs" in capsys.readouterr().err


@pytest.mark.parametrize("written, read", [(manager.FORMAT_VERSION + 1, manager.FORMAT_VERSION), (1, 2)])
def test_another_format_names_the_hlat_that_reads_it(small_corpus, tmp_path, capsys, monkeypatch, written, read):
    """The format number patched both ways: a newer hlat's checkpoint, and an older one's."""
    run = tmp_path / "run"
    monkeypatch.setattr(manager, "FORMAT_VERSION", written)
    monkeypatch.setattr(manager, "__version__", "9.8.7")
    assert _train(small_corpus, run, 2) == 0
    monkeypatch.setattr(manager, "FORMAT_VERSION", read)
    monkeypatch.setattr(manager, "__version__", __version__)
    capsys.readouterr()
    assert _train(small_corpus, run, 4) == 2
    err = capsys.readouterr().err
    assert f"checkpoint format {written}, and hlat {__version__} reads format {read}: hlat 9.8.7 reads it" in err, err
