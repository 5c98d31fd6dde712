"""train.replay_every: catch a rank that computes wrong without crashing (silent data corruption).

Under train.deterministic a micro-batch's gradient has the same bits on whichever rank computes it
(the same weights, data and kernels; one intra-op thread). So every `replay_every` steps, before
the optimizer update, each data-parallel rank recomputes the first micro-batch of another rank
(rank r checks rank (r + k) mod d, k turning over 1..d-1 from one replay to the next, so every
pair is checked in turn) and the SHA-256 of the gradient it gets is compared with the digest the
owner took of its own. A mismatch is computed a third time, by a rank outside the pair, and the
rank the other two disagree with is named: rank, host and device, in one line, in metrics.jsonl,
and as exit status 3 (`WrongComputation`, raised by the train module: recovery.wrong_computation
says which processes stop). With two ranks there is no third: both are named.

The digest is of this rank's own gradient of the micro-batch before any cross-rank sum: the
tensors FSDP2 hands its reduce-scatter (hlat.parallel.ordered_sum), or the replicated gradients.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from hlat.data.batch import Batch
from hlat.errors import UserError

EXIT_WRONG_COMPUTATION = 3


class WrongComputation(UserError):
    """A rank's gradient disagreed with two others' of the same micro-batch; exit status 3."""

    exit_code = EXIT_WRONG_COMPUTATION


_SAME_SIZE_INT = {4: torch.int32, 2: torch.int16}


def flip_one_bit(model: nn.Module) -> RemovableHandle:
    """HLAT_FAULT="flip:STEP:RANK" (hlat.faults): one mantissa bit of the first transformer block's
    first output element flips until the returned handle is removed: a wrong value of the same
    magnitude, as a failing chip gives, which nothing downstream can tell from a right one."""
    block = next(iter(model.layers.values()))

    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        first = output.detach().reshape(-1)[:1]
        first.view(_SAME_SIZE_INT[first.element_size()]).bitwise_xor_(1 << 5)

    return block.register_forward_hook(hook)


class Replay:
    """The checks of one data-parallel rank. `recompute(batch)`: the digest of this rank's gradient
    of `batch` (the train module's, weights and gradients left as they were); `record`: where rank
    0 appends its finding (metrics.jsonl)."""

    def __init__(
        self,
        every: int,
        group: dist.ProcessGroup,
        rank: int,
        ranks: int,
        device: torch.device,
        record: Path,
    ) -> None:
        self.every, self.group, self.rank, self.ranks, self.record = every, group, rank, ranks, record
        self.device = device
        self.replays = 0
        index = device.index if device.index is not None else os.environ.get("LOCAL_RANK", 0)
        host = socket.gethostname()
        where = f"global rank {dist.get_rank()}, host {host}, device {device.type}:{index}"
        every_rank: list[tuple[str, str]] = [("", "")] * ranks
        dist.all_gather_object(every_rank, (where, host), group=group)
        self.where, self.hosts = [w for w, _ in every_rank], [h for _, h in every_rank]

    def due(self, step: int) -> bool:
        return self.ranks > 1 and step % self.every == 0

    def check(self, step: int, batch: Batch, digest: bytes, recompute: Callable[[Batch], bytes]) -> str | None:
        """After the step's accumulation (its first micro-batch `batch`, whose gradient digest this
        rank took): every rank recomputes another's first micro-batch; collective over dp. The line
        that names the ranks computing wrong (recorded in metrics.jsonl), or None."""
        offset = 1 + self.replays % (self.ranks - 1)
        self.replays += 1
        batches = [b.to(self.device) for b in self._gather(batch.to(torch.device("cpu")))]
        digests = self._gather(digest)
        target = (self.rank + offset) % self.ranks  # the rank whose micro-batch this one recomputes
        replayed = self._gather(recompute(batches[target]))
        checker = {(r + offset) % self.ranks: r for r in range(self.ranks)}  # owner -> the rank that checked it
        suspects = [owner for owner in range(self.ranks) if replayed[checker[owner]] != digests[owner]]
        if not suspects:
            return None
        named: set[int] = set()
        for owner in suspects:  # one round each, every rank computing (FSDP2's collectives run on all)
            named |= self._third_opinion(owner, checker[owner], batches, digests, replayed, recompute)
        return self._name(step, sorted(named), suspects, checker)

    def _third_opinion(
        self,
        owner: int,
        checked_by: int,
        batches: list[Batch],
        digests: list[bytes],
        replayed: list[bytes],
        recompute: Callable[[Batch], bytes],
    ) -> set[int]:
        """The ranks the others disagree with about `owner`'s micro-batch."""
        if self.ranks == 2:
            return {owner, checked_by}
        third = min(r for r in range(self.ranks) if r not in (owner, checked_by))
        mine = recompute(batches[owner] if self.rank == third else batches[self.rank])
        verdict = self._gather(mine)[third]
        if verdict == replayed[checked_by]:
            return {owner}
        if verdict == digests[owner]:
            return {checked_by}
        return {owner, checked_by, third}

    def _name(self, step: int, named: list[int], suspects: list[int], checker: dict[int, int]) -> str:
        who = "; ".join(f"data-parallel rank {r} ({self.where[r]})" for r in named)
        alone = "" if self.ranks > 2 else " (two ranks: no third to tell which)"
        pairs = ", ".join(f"rank {s}'s recomputed on rank {checker[s]}" for s in suspects)
        line = (
            f"replay: at step {step} a first micro-batch's gradient came out different when recomputed "
            f"({pairs}){alone}; computing wrong: {who}"
        )
        if self.rank == 0:
            record = {
                "step": step,
                "time": time.time(),
                # hosts: what a scheduler leaves out of the job (scripts/slurm.sbatch)
                "replay": {
                    "ranks": named,
                    "where": [self.where[r] for r in named],
                    "hosts": [self.hosts[r] for r in named],
                },
            }
            with self.record.open("a") as f:
                f.write(json.dumps(record) + "\n")
        return line

    def _gather(self, value: object) -> list:
        found: list = [None] * self.ranks
        dist.all_gather_object(found, value, group=self.group)
        return found
