"""The cost of a run in its log: node-hours of the training loop times train.price_per_node_hour."""

from __future__ import annotations

import pytest

from hlat.config import load_config
from hlat.train.cost import cost_fields, node_count
from hlat.train.sinks import read_metrics
from hlat.train.trainer import Trainer
from runs import tiny_args


def test_cost_fields_by_hand():
    # 4 nodes at $21.50/h for 90 minutes: 4 x 21.5 x 1.5 = $129; over 3M tokens, $43 per million.
    assert cost_fields(21.5, 4, 5400.0, 3_000_000) == pytest.approx({"cost": 129.0, "cost_per_mtok": 43.0})
    assert cost_fields(0.0, 4, 5400.0, 3_000_000) == {}  # no price, no cost fields


def test_nodes_are_the_world_over_the_ranks_per_node(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert node_count(4096) == 256
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert node_count(1) == 1  # one process: one node


def test_log_shows_cost_so_far_and_checkpoints_keep_its_time(small_corpus, tmp_path, capsys):
    cfg = load_config("tiny", None, tiny_args(small_corpus, tmp_path / "run", "--train.steps", "2", "--parallel.compile",
                                              "false", "--checkpoint.every", "2", "--train.price_per_node_hour", "3600"))
    trainer = Trainer(cfg)
    trainer.fit()
    records = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    # $3600 per node-hour is $1 per second of one node: the cost is the loop's seconds so far.
    costs = [r["cost"] for r in records]
    assert [r["step"] for r in records] == [1, 2] and 0 < costs[0] < costs[1]
    assert costs[1] == pytest.approx(sum(r["step_s"] for r in records), rel=1e-6)
    assert records[1]["cost_per_mtok"] == pytest.approx(costs[1] / records[1]["tokens"] * 1e6)
    assert f"| cost {costs[1]:,.2f} so far, " in capsys.readouterr().out
    # A resumed run goes on from the checkpoint's loop time (a rollback keeps the larger).
    saved = trainer.checkpoints.load_shared(trainer.checkpoints.latest())["progress"]
    assert saved["train_s"] == pytest.approx(costs[1], rel=1e-6)
