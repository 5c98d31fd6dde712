"""The data of an elastic run: the global batch as a fixed number of data shares (the loader's
data-parallel ranks 0..shares-1), dealt every step to the replica groups present.

A share is one PackedLoader position; whichever group holds it reads its next micro-batches, so
the data order is the same whatever groups come and go: a group that leaves leaves its shares'
positions behind (every group holds every share's position as of the last committed step), the
survivors continue them, and a group that joins is dealt its shares back. Each step the groups
exchange the positions they advanced (one all-reduce of a few kilobytes); a step that does not
commit leaves every position where it was. In a group of several data-parallel ranks every rank
reads its shares' micro-batches and keeps every ranks-th (so all hold the same positions; the tp
ranks of a dp rank keep the same ones); the global batch and the data order stay those of one
process per group.

Under train.deterministic every share is one micro-batch of the global batch (its global index),
and a group is dealt a whole subtree of the step's summation tree (hlat.parallel.ordered_sum.tree_blocks:
consecutive shares), dealt over its ranks as GlobalBatch deals them (rank r: the r-th, (r + ranks)-th, ...).

The record (one JSON line per share per committed step: step, group, process id, wall-clock time, share, tokens, digest)
says which group trained which batch; over the run every (step, share) appears once.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hlat.data.batch import Batch
from hlat.data.packing import PackedLoader, merge_states
from hlat.digests import short_sha256
from hlat.parallel.ordered_sum import tree_blocks
from hlat.train.elastic.positions import BadPeerValue, check_lengths, position_problem
from hlat.train.elastic.replicas import Replicas


class ElasticData:
    """`make_loader(share)`: a fresh loader of data-parallel rank `share` of `shares`;
    `per_share`: the micro-batches each share gives a step, dealt over the group's `ranks`
    data-parallel ranks (this process is dp rank `rank`); `records`: this process writes the record
    (one per group); `tree`: deal shares as train.deterministic sums them (see the module)."""

    def __init__(
        self,
        make_loader: Callable[[int], PackedLoader],
        shares: int,
        per_share: int,
        record: Path,
        rank: int = 0,
        ranks: int = 1,
        records: bool = True,
        tree: bool = False,
    ):
        self.make_loader, self.shares, self.per_share, self.record = make_loader, shares, per_share, record
        self.rank, self.ranks, self.records, self.tree = rank, ranks, records, tree
        first = make_loader(0)
        self.docs, self.loaders = first.docs, {0: first}  # the shares this group holds, positioned
        self.table: list[dict[str, Any] | None] = [None] * shares  # positions after the last commit (None: start)
        self._pending: list[dict[str, Any] | None] = []
        self._read: list[tuple[int, str, int]] = []  # (share, digest, tokens) of this step's batches
        self._starts: dict[int, dict[str, Any]] = {}  # the first position of shares not yet read

    def owned(self, rank: int, groups: int) -> list[int]:
        if self.tree:
            return list(tree_blocks(self.shares, groups)[rank])
        return [j for j in range(self.shares) if j % groups == rank]

    def batches(self, rank: int, groups: int, replicas: Replicas) -> list[Batch]:
        """This process's micro-batches of the step (its group is rank `rank` of `groups`), and every
        share's new position from every group (collective over the groups present)."""
        mine = self.owned(rank, groups)
        for j in [j for j in self.loaders if j not in mine]:
            self.loaders.pop(j).close()
        reads: list[list[Batch]] = []
        self._read = []
        for j in mine:
            loader = self.loaders.get(j)
            if loader is None:
                loader = self.loaders[j] = self.make_loader(j)
                if self.table[j] is not None:
                    loader.load_state_dict(self.table[j])
            read = [loader.next_batch() for _ in range(self.per_share)]
            tokens = np.stack([b.tokens.numpy() for b in read])
            self._read.append((j, short_sha256(tokens.tobytes()), int(tokens.size)))
            reads.append(read)
        # each share's micro-batches over the ranks, or (tree) the shares themselves
        out = (
            [b for read in reads for b in read][self.rank :: self.ranks]
            if self.tree
            else [b for read in reads for b in read[self.rank :: self.ranks]]
        )
        try:
            self._pending = self._exchange({j: self.loaders[j].state_dict() for j in mine}, rank, groups, replicas)
        except BadPeerValue as bad:
            self._pending = self.table
            replicas.refuse(bad.sender, f"sent {bad}")

        return out

    def _exchange(
        self, mine: dict[int, dict[str, Any]], rank: int, groups: int, replicas: Replicas
    ) -> list[dict[str, Any] | None]:
        """Every share's position: each group gives those it holds, as JSON bytes summed over groups
        (the others give zeros); the lengths in a row per group, so that a bad value names its
        sender (BadPeerValue) before anything is allocated for it. After a failed sum the step
        cannot commit: the positions stay."""
        blobs = {j: json.dumps(state).encode() for j, state in mine.items()}
        lengths = torch.zeros(groups, self.shares, dtype=torch.int64)
        for j, blob in blobs.items():
            lengths[rank, j] = len(blob)
        replicas.sum_(lengths)
        if replicas.failed():
            return self.table
        check_lengths(lengths.tolist(), [self.owned(r, groups) for r in range(groups)])
        ends = lengths.sum(0).cumsum(0).tolist()
        payload = torch.zeros(ends[-1], dtype=torch.uint8)
        for j, blob in blobs.items():
            payload[ends[j] - len(blob) : ends[j]] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        data = bytes(replicas.sum_(payload).numpy())
        if replicas.failed():
            return self.table
        starts = [0, *ends[:-1]]
        return [
            self._parse(j, data[a:b], j % groups) if j not in blobs else mine[j]
            for j, (a, b) in enumerate(zip(starts, ends))
        ]

    def _parse(self, share: int, blob: bytes, sender: int) -> dict[str, Any]:
        """Share `share`'s position as replica rank `sender` sent it, checked against the loader's own."""
        try:
            state = json.loads(blob)
        except ValueError:
            raise BadPeerValue(sender, f"share {share}'s position is not JSON") from None
        problem = position_problem(state, self._template(share))
        if problem:
            raise BadPeerValue(sender, f"share {share}'s position {problem}")
        return state

    def _template(self, share: int) -> dict[str, Any]:
        """A position of share `share` that this group made itself: what a peer's must look like."""
        if self.table[share] is None and share not in self._starts:
            self._starts[share] = self._start(share)
        return self.table[share] or self._starts[share]

    def finish(self, committed: bool, step: int, group: str) -> None:
        """After the step's commit vote: keep the new positions and record the batches, or put back
        the old positions (the step is retried on the same data)."""
        if not committed:
            for j, _, _ in self._read:
                self.loaders.pop(j).close()
            return
        self.table, pid, now = self._pending, os.getpid(), round(time.time(), 3)
        if not self.records:
            return
        with self.record.open("a") as f:
            for j, digest, tokens in self._read:
                record = {"step": step, "group": group, "pid": pid, "time": now, "share": j, "tokens": tokens}
                f.write(json.dumps({**record, "digest": digest}) + "\n")

    @property
    def tokens_emitted(self) -> list[int]:
        """Tokens of each source emitted by every share (all groups'), as of the last commit."""
        states = [s for s in self.table if s is not None]
        return [sum(s["tokens_emitted"][k] for s in states) for k in range(len(self.docs))]

    # ---- what a rejoining group receives, and a checkpoint holds ---------------------------------
    def table_state(self) -> str:
        return json.dumps(self.table)

    def load_table_state(self, table: str) -> None:
        for loader in self.loaders.values():
            loader.close()
        self.loaders, self.table = {}, json.loads(table)

    def state_dict(self) -> dict[str, Any]:
        """Every share's position merged (hlat.data.merge_states): any layout resumes from it."""
        return merge_states([s if s is not None else self._start(j) for j, s in enumerate(self.table)])

    def _start(self, share: int) -> dict[str, Any]:
        loader = self.make_loader(share)
        loader.close()
        return loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """From a checkpoint of any layout: every share's own position where the saved run had as
        many data-parallel ranks or shares, else its part of the merged positions."""
        merged = state if state["dp_rank"] == "all" else merge_states([state])
        table = []
        for j in range(self.shares):
            loader = self.make_loader(j)
            loader.load_state_dict(merged)
            table.append(loader.state_dict())
            loader.close()
        self.load_table_state(json.dumps(table))

    def close(self) -> None:
        for loader in self.loaders.values():
            loader.close()
