"""Background (async) saves give the same checkpoints as synchronous ones, and report their
blocking and write times; archives are weights-only and never pruned."""

from hlat.checkpoint.loading import load_model
from hlat.checkpoint.manager import CheckpointManager
from hlat.config.load import load_config
from hlat.train.trainer import Trainer
from runs import assert_same_tensors, checkpoint_tensors, tiny_args


def test_async_save_equals_sync_and_archives_are_kept(small_corpus, tmp_path):
    steps = ["--train.steps", "6", "--checkpoint.every", "2", "--checkpoint.keep_last", "1"]
    Trainer(load_config("tiny", None, tiny_args(small_corpus, tmp_path / "sync", *steps)), out=lambda _: None).fit()
    messages: list[str] = []
    cfg = load_config(
        "tiny",
        None,
        tiny_args(
            small_corpus,
            tmp_path / "async",
            *steps,
            "--checkpoint.async_save",
            "true",
            "--checkpoint.archive_every_tokens",
            "512",
        ),
    )
    Trainer(cfg, out=messages.append).fit()
    assert sum("in the background (training blocked" in m for m in messages) == 3
    assert sum("committed (written in" in m for m in messages) == 3
    latest = [CheckpointManager(tmp_path / run / "checkpoints", None).latest() for run in ("sync", "async")]
    assert [p.name for p in CheckpointManager(tmp_path / "async" / "checkpoints", 1).checkpoints()] == ["step_00000006"]
    assert_same_tensors(checkpoint_tensors(latest[1], tmp_path), checkpoint_tensors(latest[0], tmp_path))
    # 256 tokens per step: an archive every 2 steps, none pruned, loadable for evaluation
    archives = CheckpointManager(tmp_path / "async" / "archive", None).checkpoints()
    assert [p.name for p in archives] == ["step_00000002", "step_00000004", "step_00000006"]
    assert not list(archives[0].glob("rank_*.pt"))
    assert load_model(archives[0]).step == 2
