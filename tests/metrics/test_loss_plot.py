"""loss.png draws every training step from step 1 (each record's step_losses), not one point per
logging window starting at the first log step."""

from __future__ import annotations

from hlat.config.load import load_config
from hlat.metrics.sinks import loss_points, read_metrics
from hlat.train.trainer import Trainer
from runs import tiny_args


def test_the_plot_has_every_step_from_the_first(small_corpus, tmp_path):
    run = tmp_path / "run"
    args = tiny_args(small_corpus, run, "--train.steps", "6", "--train.log_every", "3", "--train.plot", "true")
    summary = Trainer(load_config("tiny", None, args), out=lambda _: None).fit()
    tokens, losses = loss_points(read_metrics(run))
    per_step = 8 * 32  # global_batch x seq_len of tiny_args
    assert losses == summary.losses and len(losses) == 6  # two records of three steps each
    assert tokens == [per_step * step for step in range(1, 7)]
    assert summary.plot is not None and summary.plot.stat().st_size > 1000


def test_records_without_step_losses_plot_their_mean():
    records = [
        {"step": 3, "tokens": 30, "loss": 5.0},
        {"step": 3, "val_loss": 4.0},
        {"step": 6, "tokens": 60, "loss": 4.5},
    ]
    assert loss_points(records) == ([30, 60], [5.0, 4.5])
