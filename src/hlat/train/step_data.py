"""Where a step's micro-batches come from, as the trainer's loop sees it.

`Accumulation` is the plain case: this rank's loader, `accum` micro-batches a step. An elastic
group reads its data shares instead (hlat.train.elastic.group) behind the same interface.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed as dist

from hlat.data.batch import Batch
from hlat.data.packing import PackedLoader
from hlat.device.runtime import collective_device
from hlat.parallel.mesh import Layout


class StepData(Protocol):
    per: str  # what the step's micro-batch count is counted per, for the start line
    loader: Any  # the stateful position a checkpoint holds (state_dict / load_state_dict)

    def read(self) -> list[Batch]:
        """This rank's micro-batches of the next step."""
        ...

    def skip(self, steps: int) -> None:
        """Pass over `steps` steps' data (a rollback trains on new data)."""
        ...

    def tokens_by_source(self) -> dict[str, int]:
        """Tokens read from each data source so far, over the run's ranks (collective)."""
        ...

    def close(self) -> None: ...


class Accumulation:
    """`accum` micro-batches a step from `loader` (this data-parallel rank's)."""

    per = "data-parallel rank"

    def __init__(self, loader: PackedLoader, accum: int, layout: Layout, device: torch.device):
        self.loader, self.accum, self.layout, self.device = loader, accum, layout, device

    def read(self) -> list[Batch]:
        return [self.loader.next_batch() for _ in range(self.accum)]

    def skip(self, steps: int) -> None:
        for _ in range(steps * self.accum):
            self.loader.next_batch()

    def tokens_by_source(self) -> dict[str, int]:
        # host counts on the host where gloo carries them: not every device has float64
        counts = torch.tensor(self.loader.tokens_emitted, dtype=torch.float64, device=collective_device(self.device))
        if self.layout.dp > 1:
            dist.all_reduce(counts, group=self.layout.group("dp"))
        return {docs.name: int(n) for docs, n in zip(self.loader.docs, counts.tolist())}

    def close(self) -> None:
        self.loader.close()
