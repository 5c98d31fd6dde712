"""A checkpoint saved in one layout resumes in another with identical model and optimizer state.

TP 2 x DP 2 (zero2) on 4 gloo processes <-> DP 4 (fsdp) and one process, and ZeRO-1 on 2
processes <-> one process: the resumed run saves again at once, and every tensor of the two
checkpoints (weights, Adam moments, step counts) is bit-identical. The data position is merged
over the saved ranks and dealt to the new ones.
"""

import shutil
from pathlib import Path

import pytest

from hlat.checkpoint import CheckpointManager
from hlat.config import load_config
from hlat.train.trainer import Trainer

from runs import assert_same_tensors, checkpoint_tensors, launch, tiny_args

TP2_DP2 = ["--parallel.tp", "2", "--parallel.dp_sharding", "zero2"]
DP4 = ["--parallel.dp_sharding", "fsdp"]
ZERO1 = ["--parallel.dp_sharding", "zero1"]
RESAVE = Path(__file__).parent / "resave_worker.py"


def copy_run(src, dst):
    shutil.copytree(src / "checkpoints", dst / "checkpoints")
    return dst


def resave_here(corpus, run):
    trainer = Trainer(load_config("tiny", None, tiny_args(corpus, run, "--train.steps", "2")), resume="require", out=lambda _: None)
    trainer.save()
    return trainer


@pytest.mark.slow  # 4 torchrun launches: ~3 min on 2 cores
def test_tp2_dp2_to_dp4_and_one_process_and_back(small_corpus, tmp_path):
    saved = tmp_path / "tp2dp2"
    launch(4, tiny_args(small_corpus, saved, "--train.steps", "2", *TP2_DP2))
    reference = checkpoint_tensors(CheckpointManager(saved / "checkpoints", None).latest(), tmp_path)
    assert any(".exp_avg_sq" in k for k in reference) and any(k.startswith("model.") for k in reference)

    dp4 = copy_run(saved, tmp_path / "dp4")
    out = launch(4, tiny_args(small_corpus, dp4, "--train.steps", "2", *DP4), script=RESAVE).stdout
    assert "resharded from" in out
    assert_same_tensors(checkpoint_tensors(CheckpointManager(dp4 / "checkpoints", None).latest(), tmp_path), reference)

    single = copy_run(saved, tmp_path / "single")
    trainer = resave_here(small_corpus, single)
    assert_same_tensors(checkpoint_tensors(CheckpointManager(single / "checkpoints", None).latest(), tmp_path), reference)
    # the merged data position: the 2 saved dp ranks' tokens, now read by one rank
    assert sum(trainer.loader.tokens_emitted) == 2 * 8 * 32

    # and the reverse: from one process into TP 2 x DP 2
    back = copy_run(single, tmp_path / "back")
    launch(4, tiny_args(small_corpus, back, "--train.steps", "2", *TP2_DP2), script=RESAVE)
    assert_same_tensors(checkpoint_tensors(CheckpointManager(back / "checkpoints", None).latest(), tmp_path), reference)
    # and training goes on from the resharded checkpoint
    out = launch(4, tiny_args(small_corpus, back, "--train.steps", "3", *TP2_DP2)).stdout
    assert "done: step 3" in out


def test_zero1_to_one_process_and_back(small_corpus, tmp_path):
    """ZeRO-1 ranks each write the optimizer entries of the parameters they own, keyed by name."""
    saved = tmp_path / "zero1"
    launch(2, tiny_args(small_corpus, saved, "--train.steps", "2", *ZERO1))
    reference = checkpoint_tensors(CheckpointManager(saved / "checkpoints", None).latest(), tmp_path)
    assert any(".exp_avg_sq" in k for k in reference)

    single = copy_run(saved, tmp_path / "single")
    resave_here(small_corpus, single)
    assert_same_tensors(checkpoint_tensors(CheckpointManager(single / "checkpoints", None).latest(), tmp_path), reference)

    back = copy_run(single, tmp_path / "back")
    out = launch(2, tiny_args(small_corpus, back, "--train.steps", "2", *ZERO1), script=RESAVE).stdout
    assert "resharded from" in out
    assert_same_tensors(checkpoint_tensors(CheckpointManager(back / "checkpoints", None).latest(), tmp_path), reference)
