"""Keys and values of the positions already seen, kept across forward calls so that generating a
token costs one position's forward pass instead of the whole sequence's."""

from __future__ import annotations

import torch


class LayerKV:
    """One attention layer's keys and values [B, T, H_kv, D], preallocated to `capacity` positions
    on first use (no copy of the past per generated token)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.length = 0
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this call's keys and values; return those of every position so far."""
        if self.keys is None or self.values is None:
            shape = (k.shape[0], self.capacity, *k.shape[2:])
            self.keys, self.values = k.new_empty(shape), v.new_empty(shape)
        end = self.length + k.shape[1]
        if end > self.capacity:
            raise ValueError(
                f"the KV cache holds {self.capacity} positions; {end} were requested: "
                "build it with the prompt length plus the tokens to generate"
            )
        self.keys[:, self.length : end] = k
        self.values[:, self.length : end] = v
        self.length = end
        return self.keys[:, :end], self.values[:, :end]


class KVCache:
    """The keys and values of every layer of one batch of sequences, keyed by layer name."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.layers: dict[str, LayerKV] = {}

    def layer(self, name: str) -> LayerKV:
        if name not in self.layers:
            self.layers[name] = LayerKV(self.capacity)
        return self.layers[name]
