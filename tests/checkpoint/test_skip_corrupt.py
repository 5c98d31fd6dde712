"""`hlat export` and `hlat generate` on a run directory whose newest checkpoint is corrupt use the
one before it, as a resumed training run does, and name the one they skipped."""

from pathlib import Path

from hlat.cli import main
from runs import tiny_args


def _corrupt(checkpoint: Path) -> None:
    shard = next((checkpoint / "dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_a_corrupt_newest_checkpoint_is_skipped_and_named(small_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(small_corpus, run, "--train.steps", "2", "--checkpoint.every", "1")]) == 0
    _corrupt(run / "checkpoints" / "step_00000002")
    skipped = f"warning: skipping checkpoint {run / 'checkpoints' / 'step_00000002'}: "
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    err = capsys.readouterr().err
    assert skipped in err and "fails its SHA-256 check" in err, err
    assert (tmp_path / "hf" / "config.json").is_file()
    assert main(["generate", "--checkpoint", str(run), "--prompt", "def", "--max-new-tokens", "2"]) == 0
    assert skipped in capsys.readouterr().err
    _corrupt(run / "checkpoints" / "step_00000001")
    assert main(["export", str(run), str(tmp_path / "hf2")]) == 2
    assert f"run directory {run}: no checkpoint passes verification (step_00000002, step_00000001" in (
        capsys.readouterr().err
    )
