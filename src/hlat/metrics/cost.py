"""What a run has cost so far, from a price per node-hour (train.price_per_node_hour)."""

from __future__ import annotations

import os


def node_count(world: int) -> int:
    """Nodes a run occupies: its ranks over the ranks torchrun started per node (LOCAL_WORLD_SIZE;
    one process alone is one node)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return max(1, -(-world // max(local, 1)))


def cost_fields(price_per_node_hour: float, nodes: int, train_s: float, tokens: int) -> dict[str, float]:
    """{"cost", "cost_per_mtok"} for a record: node-hours of the training loop so far (start-up not
    counted) times the price; nothing when no price is given."""
    if price_per_node_hour <= 0:
        return {}
    cost = price_per_node_hour * nodes * train_s / 3600
    return {"cost": cost, "cost_per_mtok": cost / tokens * 1e6 if tokens else 0.0}
