"""The cost of a run in its log: node-hours of the training loop times train.price_per_node_hour
(a run's records and console line: tests/train/test_observability.py)."""

from __future__ import annotations

import pytest

from hlat.metrics.cost import cost_fields, node_count


def test_cost_fields_by_hand():
    # 4 nodes at $21.50/h for 90 minutes: 4 x 21.5 x 1.5 = $129; over 3M tokens, $43 per million.
    assert cost_fields(21.5, 4, 5400.0, 3_000_000) == pytest.approx({"cost": 129.0, "cost_per_mtok": 43.0})
    assert cost_fields(0.0, 4, 5400.0, 3_000_000) == {}  # no price, no cost fields


def test_nodes_are_the_world_over_the_ranks_per_node(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert node_count(4096) == 256
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert node_count(1) == 1  # one process: one node
