"""The order in which one data-parallel rank reads one source's documents, and its exact position.

Epoch ``e`` of a source is a seeded permutation ``perm_e`` of its documents, dealt into ``V``
virtual shards: shard ``v`` reads ``perm_e[v::V]``. Rank ``r`` of ``R`` owns the shards with
``v % R == r`` and always reads next from the owned shard that is least advanced (smallest
(epoch, cursor), then smallest ``v``). When ``R`` divides ``V`` this is exactly HLAT's
``perm_e[r::R]``. Each shard keeps its own (epoch, cursor, offset), so the position of every rank is
a set of shard positions: merging all ranks' positions and dealing the shards to a new number of
ranks continues every shard where it stopped, with no document skipped or repeated within an
epoch (``merge_states``).

Documents are tokenized ahead, in a background thread, in the order the rank will read them, and
handed over as segments: a whole document, or one piece of a long document (``TokenPieces``), so
what waits in the queue stays bounded (a few chunks of ~64k tokens, or of one tokenizer call). The
saved position only ever describes what the consumer took, so prefetching never makes it drift.
"""

from __future__ import annotations

import hashlib
import heapq
import queue
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from hlat.data.documents import DocumentTokens, TokenPieces
from hlat.data.sources import BadDocument
from hlat.errors import DataError

Key = tuple[int, int, int]  # (epoch, cursor, virtual shard)
# A document's tokens (or the BadDocument reading it raised), or a piece of them; and whether it
# is the document's last segment (then it ends with the EOS, or is empty for a blank document).
Segment = tuple[Key, np.ndarray | BadDocument, bool]
_CHUNK_TOKENS = 65_536


def epoch_permutation(num_docs: int, seed: int, epoch: int, stream: int = 0) -> torch.Tensor:
    """The global document order of an epoch: a permutation seeded from (seed, epoch, stream); the
    stream number gives each source of a mixture its own order."""
    salt = f"|{stream}" if stream else ""
    digest = hashlib.sha256(f"hlat-data|{seed}|{epoch}{salt}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return torch.randperm(num_docs, generator=g)


class _Permutations:
    """perm_e for the few epochs in use (each one is a full pass over the source)."""

    def __init__(self, num_docs: int, seed: int, stream: int):
        self.num_docs, self.seed, self.stream = num_docs, seed, stream
        self._cache: dict[int, np.ndarray] = {}

    def __call__(self, epoch: int) -> np.ndarray:
        perm = self._cache.get(epoch)
        if perm is None:
            perm = epoch_permutation(self.num_docs, self.seed, epoch, self.stream).numpy()
            if len(self._cache) >= 3:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = perm
        return perm


def _plan(heap: list[Key], lengths: dict[int, int], num_shards: int, perms: _Permutations) -> Iterator[tuple[Key, int]]:
    """(key, document index) in reading order from a heap of shard positions (consumed here)."""
    while True:
        epoch, cursor, v = heapq.heappop(heap)
        yield (epoch, cursor, v), int(perms(epoch)[v + cursor * num_shards])
        cursor += 1
        if cursor == lengths[v]:
            epoch, cursor = epoch + 1, 0
        heapq.heappush(heap, (epoch, cursor, v))


def _chunks(plan: Iterator[tuple[Key, int]], docs: DocumentTokens) -> Iterator[list[Segment]]:
    """Segments in batches: documents are tokenized in calls growing from one document to ~64k
    tokens, so each call is worth it once the run is going, while the first batch waits for one
    document only and a short run tokenizes little it never reads (the queue holds two calls'
    worth ahead); a long document's pieces are tokenized one by one and batches of them handed
    on as they reach ~64k tokens, so that no more than a window of it is held."""
    n = 1
    while True:
        keyed = [next(plan) for _ in range(n)]
        out: list[Segment] = []
        got = 0
        for (key, _), toks in zip(keyed, docs.tokens([i for _, i in keyed])):
            if not isinstance(toks, TokenPieces):
                out.append((key, toks, True))
                got += len(toks) if isinstance(toks, np.ndarray) else 0
                continue
            pieces = iter(toks)
            piece = next(pieces)
            for following in pieces:
                out.append((key, piece, False))
                got += len(piece)
                if got >= _CHUNK_TOKENS:
                    yield out
                    out, got = [], 0
                piece = following
            out.append((key, piece, True))
            got += len(piece)
        yield out
        if got < _CHUNK_TOKENS and n < 4096:
            n *= 2


def _worker(chunks: Iterator[list[Segment]], out: queue.Queue, stop: threading.Event) -> None:
    try:
        for chunk in chunks:
            while not stop.is_set():
                try:
                    out.put(chunk, timeout=0.05)
                    break
                except queue.Full:
                    pass
            if stop.is_set():
                return
    except BaseException as e:  # delivered to the consumer, raised where it reads
        out.put(e)


class RankStream:
    """One rank's documents of one source: the current document, its consumed offset, and the
    position of every owned virtual shard. Stateful."""

    def __init__(
        self,
        docs: DocumentTokens,
        seed: int,
        stream: int,
        dp_rank: int,
        dp_size: int,
        num_shards: int,
        prefetch: bool = True,
    ):
        n = len(docs)
        if dp_size > num_shards:
            raise DataError(
                f"dp_size={dp_size} exceeds data.virtual_shards={num_shards}; raise "
                f"data.virtual_shards to at least {dp_size}"
            )
        self.docs, self.seed, self.stream = docs, seed, stream
        self.dp_rank, self.dp_size, self.num_shards = dp_rank, dp_size, num_shards
        self.prefetch = prefetch
        # shard v holds perm[v::V]: ceil((n - v) / V) documents; empty shards are never read
        self.lengths = {v: -(-(n - v) // num_shards) for v in range(dp_rank, min(n, num_shards), dp_size)}
        if not self.lengths:
            raise DataError(
                f"{docs.name} has {n} documents, fewer than dp_size={dp_size}: "
                f"data-parallel rank {dp_rank} would get none; use a source with at "
                f"least {dp_size} documents"
            )
        self.docs_per_epoch = sum(self.lengths.values())
        self._perms = _Permutations(n, seed, stream)
        self.positions: dict[int, list[int]] = {v: [0, 0, 0] for v in self.lengths}  # epoch, cursor, offset
        self._heap: list[Key] = []
        self._ahead: deque[Segment] = deque()
        self.start = 0  # the head segment's first token in its document
        self.last = True  # whether the head segment ends its document
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue | None = None
        self._local: Iterator[list[Segment]] | None = None
        self._restart()

    # ---- reading --------------------------------------------------------------------------------
    def _restart(self) -> None:
        self.close()
        self._heap = [(e, c, v) for v, (e, c, _) in self.positions.items()]
        heapq.heapify(self._heap)
        chunks = _chunks(_plan(list(self._heap), self.lengths, self.num_shards, self._perms), self.docs)
        self._ahead.clear()
        self.start = 0
        self._stop = threading.Event()
        if self.prefetch:
            self._queue = queue.Queue(maxsize=2)
            self._thread = threading.Thread(
                target=_worker, args=(chunks, self._queue, self._stop), daemon=True, name="hlat-tokenize"
            )
            self._thread.start()
        else:
            self._local = chunks

    def close(self) -> None:
        """Stop the tokenizing thread and wait for it: a thread still inside the tokenizer when the
        interpreter exits aborts the process ("terminate called without an active exception")."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()  # it checks the stop flag between chunks and every 50 ms while blocked
            self._thread = None
        self._queue = self._local = None

    def __del__(self) -> None:
        if hasattr(self, "_stop"):  # construction may have failed before it was set
            self._stop.set()

    def head(self) -> tuple[np.ndarray | BadDocument, int]:
        """The head document's segment being read (its tokens from token ``start`` of the
        document on, or the BadDocument) and how many of the document's tokens were already
        consumed; ``last`` says whether the segment ends the document."""
        key = self._heap[0]
        offset = self.positions[key[2]][2]
        while True:
            while not self._ahead:
                item = self._queue.get() if self._queue is not None else next(self._local)  # type: ignore[arg-type]
                if isinstance(item, BaseException):
                    raise item
                self._ahead.extend(item)
            got, seg, last = self._ahead[0]
            assert got == key, (got, key)  # the prefetcher follows the same plan
            if last or isinstance(seg, BadDocument) or offset < self.start + len(seg):
                break
            self._ahead.popleft()  # a piece already consumed (or passed over when resuming)
            self.start += len(seg)
        if isinstance(seg, np.ndarray) and len(seg) and offset >= self.start + len(seg):
            raise ValueError(
                f"loader state points at token {offset} of a document of {self.start + len(seg)} "
                "tokens: the data or the tokenizer changed since it was saved"
            )
        self.last = last
        return seg, offset

    def consume(self, n: int) -> None:
        """n more tokens of the head document were emitted."""
        self.positions[self._heap[0][2]][2] += n

    def advance(self) -> None:
        """The head document is finished (or skipped): move its shard on."""
        epoch, cursor, v = heapq.heappop(self._heap)
        self._ahead.popleft()
        self.start = 0
        cursor += 1
        if cursor == self.lengths[v]:
            epoch, cursor = epoch + 1, 0
        self.positions[v] = [epoch, cursor, 0]
        heapq.heappush(self._heap, (epoch, cursor, v))

    # ---- position -------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._heap[0][0]

    @property
    def documents_seen(self) -> int:
        return sum(e * self.lengths[v] + c for v, (e, c, _) in self.positions.items())

    def documents_for_epoch(self, epoch: int) -> list[int]:
        """The source indices this rank reads in an epoch when its shards are in step."""
        perm = self._perms(epoch)
        rows = max(self.lengths.values())
        return [
            int(perm[v + c * self.num_shards]) for c in range(rows) for v in sorted(self.lengths) if c < self.lengths[v]
        ]

    def state_dict(self) -> dict[str, Any]:
        return {str(v): list(p) for v, p in self.positions.items()}

    def load_state_dict(self, shards: dict[str, Any]) -> None:
        """Positions of (at least) every owned shard; shards of other ranks are ignored."""
        missing = [v for v in self.lengths if str(v) not in shards]
        if missing:
            raise ValueError(
                f"the saved data position lacks virtual shards {missing[:5]} of rank "
                f"{self.dp_rank}: resuming on another data-parallel size needs the merged "
                "state of all ranks (hlat.data.merge_states)"
            )
        for v in self.lengths:
            epoch, cursor, offset = (int(x) for x in shards[str(v)])
            if epoch < 0 or not 0 <= cursor < self.lengths[v] or offset < 0:
                raise ValueError(
                    f"invalid data position for virtual shard {v}: epoch={epoch}, "
                    f"cursor={cursor}, offset={offset} (it has {self.lengths[v]} documents)"
                )
            self.positions[v] = [epoch, cursor, offset]
        self._restart()
