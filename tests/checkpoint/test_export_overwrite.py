"""hlat export writes into a new or empty directory; --overwrite replaces an earlier export (no
stale shard or index survives) and refuses a directory holding anything else; a planted link is
removed, never followed. It says which step it exported, and the weights are as readable as the
other files it writes."""

import stat

from hlat.cli import USER_ERROR_EXIT, main
from hlat.config.load import load_config
from hlat.train.trainer import Trainer
from runs import tiny_args


def test_export_over_an_earlier_export(tmp_path, small_corpus, capsys):
    run, out = tmp_path / "run", tmp_path / "hf"
    Trainer(load_config("tiny", None, tiny_args(small_corpus, run, "--train.steps", "1")), out=lambda _: None).fit()
    assert main(["export", str(run), str(out), "--shard-gb", str(100_000 / 2**30)]) == 0
    sharded = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" in sharded
    capsys.readouterr()
    assert main(["export", str(run), str(out)]) == USER_ERROR_EXIT
    assert f"{out} is not empty" in capsys.readouterr().err and sorted(p.name for p in out.iterdir()) == sharded
    victim = tmp_path / "victim.json"
    victim.write_text("the user's file")
    (out / "config.json").unlink()
    (out / "config.json").symlink_to(victim)
    capsys.readouterr()
    assert main(["export", str(run), str(out), "--overwrite"]) == 0
    assert capsys.readouterr().out.startswith("exported step 1 (run/step_00000001) of ")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert len(set(modes.values())) == 1, modes  # safetensors alone would make its file owner-only
    assert victim.read_text() == "the user's file" and not (out / "config.json").is_symlink()
    assert not (out / "model.safetensors.index.json").exists()  # one file now: no stale shards or index
    assert [p.name for p in out.glob("model*")] == ["model.safetensors"]
    (out / "README.md").write_text("mine")
    capsys.readouterr()
    assert main(["export", str(run), str(out), "--overwrite"]) == USER_ERROR_EXIT
    assert "holds files hlat export does not write (README.md)" in capsys.readouterr().err
    assert (out / "README.md").read_text() == "mine" and (out / "model.safetensors").is_file()
