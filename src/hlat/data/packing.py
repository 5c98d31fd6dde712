"""HLAT's online example packing, with an exact, resumable position.

Per epoch ``e`` the documents are put in a seeded random order (a fresh permutation each epoch),
and data-parallel rank ``r`` of ``R`` reads ``perm[r::R]``. Each document is split into pieces of
at most ``max_doc_chars`` characters (at newlines where possible), the pieces are tokenized and
concatenated, and ONE EOS is appended (no BOS). Documents form one token stream, cut into rows of
exactly ``seq_len`` tokens; what is left of a document carries into the next row, and into the next
epoch. Empty documents (whitespace only) are skipped.

Documents are tokenized ahead in batches (one fast Rust ``encode_batch`` call for many
documents), but the state describes only what ``next_batch`` has returned: the epoch, the position
(``cursor``) in this rank's order of the document being consumed, and how many of its tokens
(``offset``) were already emitted. Resuming re-tokenizes that document and continues exactly where
the uninterrupted run would have.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hlat.data.sources import DocumentSource
from hlat.data.tokenizer import Tokenizer

IGNORE_INDEX = -100
_STATE_VERSION = 1


@dataclass
class Batch:
    tokens: torch.Tensor  # int64 [B, T]
    labels: torch.Tensor  # int64 [B, T]: labels[:, t] = tokens[:, t+1], labels[:, T-1] = -100

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return Batch(
            self.tokens.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
        )

    @property
    def num_tokens(self) -> int:
        return self.tokens.numel()


def labels_for(tokens: torch.Tensor) -> torch.Tensor:
    """Next-token targets inside each row; the last position has none (IGNORE_INDEX)."""
    labels = torch.full_like(tokens, IGNORE_INDEX)
    labels[:, :-1] = tokens[:, 1:]
    return labels


def split_document(text: str, max_chars: int) -> list[str]:
    """Pieces of at most max_chars characters whose concatenation is text, cut after the last
    newline in each window when there is one (else at max_chars)."""
    if len(text) <= max_chars:
        return [text]
    pieces = []
    start, n = 0, len(text)
    while n - start > max_chars:
        cut = text.rfind("\n", start, start + max_chars)
        end = cut + 1 if cut >= start else start + max_chars
        pieces.append(text[start:end])
        start = end
    pieces.append(text[start:])
    return pieces


def epoch_permutation(num_docs: int, seed: int, epoch: int) -> torch.Tensor:
    """The global document order of an epoch: a permutation seeded from (seed, epoch)."""
    digest = hashlib.sha256(f"hlat-data|{seed}|{epoch}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return torch.randperm(num_docs, generator=g)


class PackedLoader:
    """Endless batches of packed rows for one data-parallel rank. Stateful: ``state_dict()`` /
    ``load_state_dict()`` save and restore the exact position (plain ints and strings)."""

    # Tokenize ahead at least this many documents (and this many characters) per encode_batch call.
    min_docs_per_encode = 64
    min_chars_per_encode = 256_000
    max_docs_per_encode = 4096

    def __init__(
        self,
        source: DocumentSource,
        tokenizer: Tokenizer,
        seq_len: int,
        batch_size: int,
        seed: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        max_doc_chars: int = 100_000,
    ):
        if seq_len < 2:
            raise ValueError(f"seq_len={seq_len} must be at least 2")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")
        if max_doc_chars < 1:
            raise ValueError(f"max_doc_chars={max_doc_chars} must be positive")
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank={dp_rank} must be in [0, dp_size={dp_size})")
        self.source = source
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.max_doc_chars = max_doc_chars
        self._num_docs = len(source)
        # Every epoch permutes all documents, so each rank's share has the same length every epoch.
        self.docs_per_epoch = len(range(dp_rank, self._num_docs, dp_size))
        if self.docs_per_epoch == 0:
            raise ValueError(
                f"{source.name} has {self._num_docs} documents, fewer than dp_size={dp_size}: "
                f"data-parallel rank {dp_rank} would get none; use a source with at least "
                f"{dp_size} documents"
            )
        self._fingerprint = source.fingerprint()
        self._tokenizer_fp = tokenizer.fingerprint()
        # Position of the next token to emit: (epoch, cursor in this rank's order, offset in doc).
        self._epoch = 0
        self._cursor = 0
        self._offset = 0
        self._skipped = 0  # empty documents passed over
        self._orders: dict[int, list[int]] = {}
        self._ahead: deque[tuple[int, int, np.ndarray]] = deque()  # (epoch, cursor, tokens)

    # ---- position -------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def documents_seen(self) -> int:
        """Documents of this rank fully emitted (empty ones included), over all epochs."""
        return self._epoch * self.docs_per_epoch + self._cursor

    @property
    def documents_skipped(self) -> int:
        """Empty documents passed over so far."""
        return self._skipped

    def documents_for_epoch(self, epoch: int) -> list[int]:
        """The source indices this rank reads in an epoch, in order."""
        order = self._orders.get(epoch)
        if order is None:
            perm = epoch_permutation(self._num_docs, self.seed, epoch)
            order = perm[self.dp_rank :: self.dp_size].tolist()
            if len(self._orders) >= 2:
                self._orders.pop(min(self._orders))
            self._orders[epoch] = order
        return order

    # ---- tokenization ---------------------------------------------------------------------------
    def document_tokens(self, index: int) -> np.ndarray:
        """The tokens a document adds to the stream (its pieces' tokens + EOS; none if blank)."""
        return self._tokenize([self.source[index]])[0]

    def _tokenize(self, texts: list[str]) -> list[np.ndarray]:
        pieces: list[str] = []
        counts: list[int] = []
        for text in texts:
            if text.strip():
                parts = split_document(text, self.max_doc_chars)
                pieces.extend(parts)
                counts.append(len(parts))
            else:
                counts.append(0)
        ids = self.tokenizer.encode_batch(pieces)
        out: list[np.ndarray] = []
        k = 0
        eos = [self.tokenizer.eos_id]
        for c in counts:
            if c == 0:
                out.append(np.empty(0, dtype=np.int64))
                continue
            toks = ids[k] if c == 1 else [t for part in ids[k : k + c] for t in part]
            out.append(np.array(toks + eos, dtype=np.int64))
            k += c
        return out

    def _refill(self) -> None:
        """Tokenize documents ahead, starting at the current position, within the current epoch."""
        self._ahead.clear()
        order = self.documents_for_epoch(self._epoch)
        texts: list[str] = []
        chars = 0
        c = self._cursor
        while c < len(order) and (
            len(texts) < self.min_docs_per_encode or chars < self.min_chars_per_encode
        ):
            text = self.source[order[c]]
            texts.append(text)
            chars += len(text)
            c += 1
            if len(texts) >= self.max_docs_per_encode:
                break
        for j, toks in enumerate(self._tokenize(texts)):
            self._ahead.append((self._epoch, self._cursor + j, toks))

    def _current(self) -> np.ndarray:
        while self._ahead and self._ahead[0][:2] != (self._epoch, self._cursor):
            self._ahead.popleft()
        if not self._ahead:
            self._refill()
        return self._ahead[0][2]

    def _advance(self) -> None:
        self._ahead.popleft()
        self._offset = 0
        self._cursor += 1
        if self._cursor == self.docs_per_epoch:
            self._cursor = 0
            self._epoch += 1

    def _fill(self, row: np.ndarray) -> None:
        pos, n = 0, row.shape[0]
        empty_run = 0
        while pos < n:
            doc = self._current()
            if doc.shape[0] == 0:
                self._skipped += 1
                empty_run += 1
                if empty_run > self.docs_per_epoch:
                    raise ValueError(
                        f"every document of data-parallel rank {self.dp_rank}'s share of "
                        f"{self.source.name} is empty: there is nothing to train on"
                    )
                self._advance()
                continue
            empty_run = 0
            if self._offset >= doc.shape[0]:
                raise ValueError(
                    f"loader state points at token {self._offset} of a document of "
                    f"{doc.shape[0]} tokens: the data or the tokenizer changed since it was saved"
                )
            take = min(n - pos, doc.shape[0] - self._offset)
            row[pos : pos + take] = doc[self._offset : self._offset + take]
            pos += take
            self._offset += take
            if self._offset == doc.shape[0]:
                self._advance()

    def next_batch(self) -> Batch:
        rows = np.empty((self.batch_size, self.seq_len), dtype=np.int64)
        for b in range(self.batch_size):
            self._fill(rows[b])
        tokens = torch.from_numpy(rows)
        return Batch(tokens=tokens, labels=labels_for(tokens))

    def __iter__(self):
        while True:
            yield self.next_batch()

    # ---- Stateful -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "cursor": self._cursor,
            "offset": self._offset,
            "documents_skipped": self._skipped,
            "seed": self.seed,
            "dp_rank": self.dp_rank,
            "dp_size": self.dp_size,
            "seq_len": self.seq_len,
            "max_doc_chars": self.max_doc_chars,
            "source": self._fingerprint,
            "tokenizer": self._tokenizer_fp,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        required = ("epoch", "cursor", "offset", "seed", "dp_size", "seq_len", "source")
        missing = [k for k in required if k not in state]
        if missing:
            raise ValueError(
                f"data loader state lacks {', '.join(missing)}: not a PackedLoader state"
            )
        reshard = "resharding a saved data position onto another layout comes in a later release"
        mine = self.state_dict()
        checks = [
            ("source", "the checkpoint was made on different data",
             "resume with the same data.source"),
            ("tokenizer", "the checkpoint was made with a different tokenizer",
             "resume with the same data.tokenizer"),
            ("seq_len", "the checkpoint was made with a different seq_len",
             f"resume with data.seq_len={state['seq_len']}; {reshard}"),
            ("max_doc_chars", "the checkpoint was made with a different max_doc_chars",
             f"resume with data.max_doc_chars={state.get('max_doc_chars')}"),
            ("dp_size", "the checkpoint was made with a different data-parallel size",
             f"resume with data-parallel size {state['dp_size']}; {reshard}"),
            ("dp_rank", "this state belongs to another data-parallel rank",
             "give each rank its own saved loader state"),
            ("seed", "the checkpoint was made with a different seed",
             f"resume with seed {state['seed']}"),
        ]  # fmt: skip
        for key, what, fix in checks:
            if key in state and state[key] != mine[key]:
                raise ValueError(
                    f"cannot resume the data loader: {what} (saved {key}={state[key]!r}, "
                    f"now {mine[key]!r}); {fix}"
                )
        epoch, cursor, offset = int(state["epoch"]), int(state["cursor"]), int(state["offset"])
        if epoch < 0 or not 0 <= cursor < self.docs_per_epoch or offset < 0:
            raise ValueError(
                f"invalid data loader state: epoch={epoch}, cursor={cursor}, offset={offset} "
                f"(this rank has {self.docs_per_epoch} documents per epoch)"
            )
        self._epoch, self._cursor, self._offset = epoch, cursor, offset
        self._skipped = int(state.get("documents_skipped", 0))
        self._ahead.clear()
