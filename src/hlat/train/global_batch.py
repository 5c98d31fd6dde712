"""train.deterministic's data: the global batch as the same micro-batches in the same global order
for every data-parallel layout.

The global batch is global_batch / micro_batch data shares, each one PackedLoader position (the
loader of data-parallel rank j of that many: hlat.data.build_loader), giving one micro-batch a step:
micro-batch j of every step is share j's, whatever the layout. Rank r of d holds shares r, r + d,
r + 2d, ... and reads them in that order (accumulation slot t is share t*d + r: the order
hlat.train.deterministic sums in). A checkpoint holds every share's position, merged
(hlat.data.merge_states): the same state on every rank and for every layout, so a run resumes
from it on any dp degree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hlat.data.batch import Batch
from hlat.data.packing import PackedLoader, merge_states
from hlat.device.runtime import collective_device
from hlat.parallel.mesh import Layout


class GlobalBatch:
    """The step data (hlat.train.step_data.StepData) of train.deterministic. `make_loader(share)`:
    a fresh loader of share `share` of `shares`."""

    per = "data-parallel rank"

    def __init__(
        self, make_loader: Callable[[int], PackedLoader], shares: int, layout: Layout, device: torch.device
    ) -> None:
        self.layout, self.device, self.shares = layout, device, shares
        self.mine = list(range(layout.dp_rank, shares, layout.dp))
        self.loaders = [make_loader(share) for share in self.mine]
        self.docs = self.loaders[0].docs
        self.loader = self  # the position a checkpoint holds: every share's

    def read(self) -> list[Batch]:
        return [loader.next_batch() for loader in self.loaders]

    def skip(self, steps: int) -> None:
        for _ in range(steps):
            self.read()

    @property
    def tokens_emitted(self) -> list[int]:
        """Tokens of each source this rank's shares emitted."""
        return [sum(loader.tokens_emitted[k] for loader in self.loaders) for k in range(len(self.docs))]

    def tokens_by_source(self) -> dict[str, int]:
        counts = torch.tensor(self.tokens_emitted, dtype=torch.float64, device=collective_device(self.device))
        if self.layout.dp > 1:
            dist.all_reduce(counts, group=self.layout.group("dp"))
        return {docs.name: int(n) for docs, n in zip(self.docs, counts.tolist())}

    def state_dict(self) -> dict[str, Any]:
        """Every share's position merged, the same on every rank (collective over dp)."""
        states = [loader.state_dict() for loader in self.loaders]
        if self.layout.dp > 1:
            every: list[list[dict[str, Any]]] = [[] for _ in range(self.layout.dp)]
            dist.all_gather_object(every, states, group=self.layout.group("dp"))
            states = [state for rank_states in every for state in rank_states]
        return merge_states(states)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """From a checkpoint of any layout or mode: each share takes its own position back where the
        saved run had as many shares, else its part of the merged positions."""
        merged = state if state["dp_rank"] == "all" else merge_states([state])
        for loader in self.loaders:
            loader.load_state_dict(merged)

    def close(self) -> None:
        for loader in self.loaders:
            loader.close()
