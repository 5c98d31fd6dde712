"""HLAT's online example packing over one source or a weighted mixture, with an exact position.

Each document's tokens are followed by ONE EOS (no BOS; with ``bos_id``, i.e. ``data.bos``, each
document is BOS + tokens + EOS); documents form one token stream, cut into rows of exactly
``seq_len`` tokens; what is left of a document carries into the next row, and into the next epoch.
Blank documents are skipped and counted; unreadable ones (``BadDocument``) raise, or
are skipped, counted and logged with ``bad_documents="skip"``.

Mixtures: every row comes from one source, chosen by the row's place in its global batch (the
dp_size x step_rows rows of one optimizer step; BatchMixture): each global batch holds each
source's rows within one of weight x rows, at every data-parallel size. Each source packs its
own documents into its rows, carrying a document cut at a row's end into that source's next row. A loader resumed from a state saved before this order (no "mixture" in it)
keeps the older one: at each document boundary the source furthest behind its token share.

The state (``state_dict``) is only what ``next_batch`` has returned: per source, the position of
every virtual shard this rank owns (see order.py) and the tokens emitted; the source whose document
is in progress; skip counters. Resuming re-tokenizes the document in progress and continues exactly.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hlat.data.batch import IGNORE_INDEX, Batch, labels_for, make_batch
from hlat.data.documents import (
    BosDocuments,
    DocumentTokens,
    OnlineDocuments,
    TokenPieces,
    split_document,
)
from hlat.data.order import RankStream, epoch_permutation
from hlat.data.sources import BadDocument, DocumentSource
from hlat.errors import DataError, ResumeError

__all__ = ["IGNORE_INDEX", "Batch", "PackedLoader", "epoch_permutation", "labels_for", "merge_states", "split_document"]

log = logging.getLogger(__name__)
_STATE_VERSION = 2


class PackedLoader:
    """Endless batches of packed rows for one data-parallel rank. Stateful: ``state_dict()`` /
    ``load_state_dict()`` save and restore the exact position (plain ints, strings and lists)."""

    def __init__(
        self,
        sources: DocumentSource | DocumentTokens | Sequence[DocumentSource | DocumentTokens],
        tokenizer: Any,
        *,
        seq_len: int,
        batch_size: int,
        seed: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        max_doc_chars: int = 100_000,
        weights: Sequence[float] | None = None,
        virtual_shards: int = 512,
        document_masking: bool = False,
        mask_eos_target: bool = True,
        bad_documents: str = "error",
        bos_id: int | None = None,
        prefetch: bool = True,
        log_fn: Callable[[str], None] | None = None,
        step_rows: int | None = None,
    ):
        """`step_rows`: this rank's rows per optimizer step (micro-batch x accumulation; default one
        micro-batch), which places each row in its global batch for the mixture."""
        if seq_len < 2:
            raise ValueError(f"seq_len={seq_len} must be at least 2")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank={dp_rank} must be in [0, dp_size={dp_size})")
        if bad_documents not in ("error", "skip"):
            raise ValueError(f"bad_documents={bad_documents!r}: use error or skip")
        items = list(sources) if isinstance(sources, (list, tuple)) else [sources]
        self.docs: list[DocumentTokens] = [
            d if isinstance(d, DocumentTokens) else OnlineDocuments(d, tokenizer, max_doc_chars) for d in items
        ]
        self.weights = [float(w) for w in weights] if weights is not None else [1.0] * len(self.docs)
        if len(self.weights) != len(self.docs) or any(not w > 0 for w in self.weights):
            raise ValueError(
                f"weights={list(self.weights)}: give one positive weight per source ({len(self.docs)} sources)"
            )
        self.eos_id: int = tokenizer.eos_id
        for d in self.docs:
            if d.eos_id != self.eos_id:
                raise DataError(
                    f"{d.name} was tokenized with EOS id {d.eos_id}, the tokenizer's is "
                    f"{self.eos_id}: use the tokenizer the shards were made with"
                )
        if bos_id is not None:  # the BOS follows the previous EOS, so make_batch puts it in its document
            self.docs = [BosDocuments(d, bos_id) for d in self.docs]
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.max_doc_chars, self.virtual_shards = max_doc_chars, virtual_shards
        self.document_masking, self.mask_eos_target = document_masking, mask_eos_target
        self.skip_bad = bad_documents == "skip"
        self._log = log_fn or log.warning
        self.streams = [
            RankStream(d, seed, k, dp_rank, dp_size, virtual_shards, prefetch) for k, d in enumerate(self.docs)
        ]
        self.docs_per_epoch = sum(s.docs_per_epoch for s in self.streams)
        self.tokens_emitted = [0] * len(self.docs)
        self._current: int | None = None  # the source whose document is in progress
        self.step_rows = step_rows or batch_size
        if self.step_rows % batch_size:
            raise ValueError(f"step_rows={self.step_rows} must be a multiple of batch_size={batch_size}")
        self.mixture = "rows"  # the order a resumed older state keeps is "tokens" (the module's docstring)
        self.rows_emitted = 0
        self._mixture = BatchMixture(self.weights, dp_size * self.step_rows)
        self.empty_skipped = 0
        self.bad_skipped = 0

    # ---- position -------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch of the first source on this rank."""
        return self.streams[0].epoch

    @property
    def documents_seen(self) -> int:
        """Documents of this rank fully emitted or skipped, over all epochs and sources."""
        return sum(s.documents_seen for s in self.streams)

    @property
    def documents_skipped(self) -> int:
        return self.empty_skipped + self.bad_skipped

    def documents_for_epoch(self, epoch: int, source: int = 0) -> list[int]:
        return self.streams[source].documents_for_epoch(epoch)

    def document_tokens(self, index: int, source: int = 0) -> np.ndarray:
        """All tokens of one document, EOS (and BOS) included (a long one is joined: for inspection)."""
        toks = self.docs[source].tokens([index])[0]
        if isinstance(toks, BadDocument):
            raise toks
        return toks.array() if isinstance(toks, TokenPieces) else toks

    def token_shares(self) -> dict[str, float]:
        """Each source's share of the tokens emitted so far."""
        total = max(sum(self.tokens_emitted), 1)
        return {d.name: n / total for d, n in zip(self.docs, self.tokens_emitted)}

    # ---- packing --------------------------------------------------------------------------------
    def _row_source(self) -> int | None:
        """The source the next row comes from, or None where rows mix sources (one source; the older order)."""
        if len(self.docs) == 1 or self.mixture != "rows":
            return None
        batch, row = divmod(self.rows_emitted, self.step_rows)
        return self._mixture.places(batch)[self.dp_rank * self.step_rows + row]

    def _pick(self) -> int:
        if self._current is None:
            self._current = min(range(len(self.docs)), key=lambda k: self.tokens_emitted[k] / self.weights[k])
        return self._current

    def _fill(self, row: np.ndarray, source: int | None) -> None:
        """Pack `row` from `source`'s documents, or (None) from the source each document boundary picks."""
        pos, n = 0, row.shape[0]
        blank_run = 0
        while pos < n:
            k = self._pick() if source is None else source
            stream = self.streams[k]
            seg, offset = stream.head()
            offset, last = offset - stream.start, stream.last
            if isinstance(seg, BadDocument) or (last and seg.shape[0] == 0):  # only a blank document ends empty
                if isinstance(seg, BadDocument):
                    if not self.skip_bad:
                        raise seg
                    self.bad_skipped += 1
                    if self.bad_skipped <= 10 or self.bad_skipped % 1000 == 0:
                        self._log(f"skipped bad document #{self.bad_skipped} (data.bad_documents=skip): {seg}")
                else:
                    self.empty_skipped += 1
                blank_run += 1
                # unusable documents at the end of one epoch and the start of the next make a run
                # of under two epochs' worth while any document is usable
                if blank_run > 2 * self.docs_per_epoch:
                    raise DataError(
                        f"every document of data-parallel rank {self.dp_rank}'s share of "
                        f"{self.docs[k].name} is empty or unreadable: nothing to train on"
                    )
                stream.advance()
                self._current = None
                continue
            blank_run = 0
            take = min(n - pos, seg.shape[0] - offset)
            row[pos : pos + take] = seg[offset : offset + take]
            pos += take
            self.tokens_emitted[k] += take
            stream.consume(take)
            if last and offset + take == seg.shape[0]:
                stream.advance()
                self._current = None

    def next_batch(self) -> Batch:
        rows = np.empty((self.batch_size, self.seq_len), dtype=np.int64)
        for b in range(self.batch_size):
            source = self._row_source()
            if source is not None:
                self._current = source  # the row's source; its document in progress stays its own
            self._fill(rows[b], source)
            self.rows_emitted += 1
        return make_batch(torch.from_numpy(rows), self.eos_id, self.document_masking, self.mask_eos_target)

    def __iter__(self):
        while True:
            yield self.next_batch()

    def close(self) -> None:
        for s in self.streams:
            s.close()

    # ---- Stateful -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "seed": self.seed,
            "dp_rank": self.dp_rank,
            "dp_size": self.dp_size,
            "seq_len": self.seq_len,
            "virtual_shards": self.virtual_shards,
            "sources": [d.fingerprint() for d in self.docs],
            "weights": list(self.weights),
            "shards": [s.state_dict() for s in self.streams],
            "tokens_emitted": list(self.tokens_emitted),
            "current": -1 if self._current is None else self._current,
            "mixture": self.mixture,
            "rows": self.rows_emitted,
            "empty_skipped": self.empty_skipped,
            "bad_skipped": self.bad_skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from this rank's own state, or from ``merge_states`` of all ranks' states (any
        earlier data-parallel size: the shards are dealt to the current ranks)."""
        if state.get("version") != _STATE_VERSION:
            raise ResumeError(
                f"data loader state version {state.get('version')!r} is not "
                f"{_STATE_VERSION}: it was saved by another hlat version; start the data anew"
            )
        mine = self.state_dict()
        checks = [
            ("sources", "different data or tokenizer (or data.max_doc_chars or data.bos)",
             "resume with the same data.source, data.tokenizer, data.max_doc_chars and data.bos"),
            ("weights", "different mixture weights", "resume with the same data.weights"),
            ("seed", "a different seed", f"resume with seed {state.get('seed')}"),
            ("virtual_shards", "a different data.virtual_shards",
             f"resume with data.virtual_shards={state.get('virtual_shards')}"),
            ("seq_len", "a different seq_len", f"resume with data.seq_len={state.get('seq_len')}"),
        ]  # fmt: skip
        for key, what, fix in checks:
            if state.get(key) != mine[key]:
                named = _source_change(state.get(key), mine[key]) if key == "sources" else None
                values = f"saved {key}={state.get(key)!r}, now {mine[key]!r}"
                what, values, fix = named or (what, values, fix)
                raise ResumeError(
                    f"cannot resume the data loader: the checkpoint was made with {what} ({values}); {fix}"
                )
        ranks = state.get("ranks", [])
        if state["dp_rank"] == "all" and len(ranks) == self.dp_size:  # merged from as many ranks: its own, exactly
            state = ranks[self.dp_rank]
        merged = state["dp_rank"] == "all"
        if not merged and (state["dp_size"], state["dp_rank"]) != (self.dp_size, self.dp_rank):
            raise ValueError(
                f"cannot resume the data loader: the state is rank {state['dp_rank']} of "
                f"{state['dp_size']}, this is rank {self.dp_rank} of {self.dp_size}; give "
                "each rank its own state, or merge_states(all ranks' states) to reshard"
            )
        for stream, shards in zip(self.streams, state["shards"]):
            stream.load_state_dict(shards)
        self.mixture = state.get("mixture", "tokens")  # a state from before per-batch mixtures keeps its order
        if merged:  # this rank's share of what all ranks emitted; scheduling only needs ratios
            self.tokens_emitted = [t // self.dp_size for t in state["tokens_emitted"]]
            self.rows_emitted = int(state.get("rows", 0)) // self.dp_size  # saved at a step's end: a place 0
            self._current = None
            self.empty_skipped = self.bad_skipped = 0
        else:
            self.tokens_emitted = list(state["tokens_emitted"])
            self.rows_emitted = int(state.get("rows", 0))
            self._current = None if state["current"] < 0 else int(state["current"])
            self.empty_skipped, self.bad_skipped = int(state["empty_skipped"]), int(state["bad_skipped"])


class BatchMixture:
    """Which source each row of each global batch comes from. Batch s holds floor(w x rows) or one
    more rows of each source (so within one of weight x rows), the extra rows going to the sources
    furthest behind their share of every batch so far (so the shares hold over the run as well).
    Within the batch the rows are interleaved in the error-minimising order of Megatron's blended
    datasets (each source's count of places 0..i stays within one of its share), so every
    data-parallel rank's slice holds a mix. A pure function of (weights, rows, s): every rank, and
    every data-parallel size, computes the same."""

    def __init__(self, weights: Sequence[float], rows: int) -> None:
        total = sum(weights)
        self.shares = [w / total * rows for w in weights]  # rows of each source a batch should hold
        self.rows = rows
        self._batch, self._cumulative = 0, [0] * len(weights)  # before batch _batch
        self._places: list[int] = []
        self._places_of = -1

    def places(self, batch: int) -> list[int]:
        """The source of each of batch `batch`'s rows."""
        if batch != self._places_of:
            self._places, self._places_of = self._interleave(self._counts(batch)), batch
        return self._places

    def _counts(self, batch: int) -> list[int]:
        if batch < self._batch:  # resumed earlier than the cache: from the start again (cheap)
            self._batch, self._cumulative = 0, [0] * len(self.shares)
        while True:
            base = [int(share) for share in self.shares]
            behind = [
                share * (self._batch + 1) - done - b for share, done, b in zip(self.shares, self._cumulative, base)
            ]
            for k in sorted(range(len(base)), key=lambda k: (-behind[k], k))[: self.rows - sum(base)]:
                base[k] += 1
            if self._batch == batch:
                return base
            self._cumulative = [done + c for done, c in zip(self._cumulative, base)]
            self._batch += 1

    def _interleave(self, counts: list[int]) -> list[int]:
        placed, order = [0] * len(counts), []
        for i in range(self.rows):
            k = max(range(len(counts)), key=lambda j: counts[j] * (i + 1) - self.rows * placed[j])
            placed[k] += 1
            order.append(k)
        return order


# A source fingerprint is SOURCE|tok=TOKENIZER|split=MAX_DOC_CHARS (documents.tokens_fingerprint;
# shards record the one they were made with), then [LABEL:DIGEST] for the training share of a
# held-out split (loader.DocumentsSubset), then |bos=ID with data.bos (BosDocuments).
_FINGERPRINT = re.compile(
    r"^(?P<source>.*)\|tok=(?P<tok>[^|\[]*)\|split=(?P<split>\d+)"
    r"(?P<subset>(?:\[[^\]]*\])*)(?:\|bos=(?P<bos>[^|]*))?$"
)


def _source_change(saved: Any, now: list[str]) -> tuple[str, str, str] | None:
    """(what changed, its saved and new values, how to resume) for a change of source fingerprints,
    naming the one setting that changed: the fingerprints alone are opaque to the user. None when
    they cannot be told apart (the caller's general message then)."""
    if not isinstance(saved, list) or not all(isinstance(f, str) for f in saved):
        return None
    if len(saved) != len(now):
        return (
            "a different data.source",
            f"saved {len(saved)} source(s), now {len(now)}",
            "resume with the same data.source",
        )
    for old, new in zip(saved, now):
        a, b = _FINGERPRINT.match(old), _FINGERPRINT.match(new)
        if old == new or a is None or b is None:
            continue
        if a["source"] != b["source"]:
            return (
                "a different data.source",
                f"saved source {a['source']!r}, now {b['source']!r}",
                "resume with the same data.source",
            )
        if a["tok"] != b["tok"]:
            return (
                "a different tokenizer",
                "its vocabulary or merges differ from the tokenizer the checkpoint was made with",
                "resume with that data.tokenizer (the run directory keeps a copy: tokenizer.json)",
            )
        if a["split"] != b["split"]:
            return (
                "a different data.max_doc_chars",
                f"saved data.max_doc_chars={a['split']}, now {b['split']}",
                f"resume with data.max_doc_chars={a['split']}",
            )
        if a["subset"] != b["subset"]:
            return (
                "a different training split",
                f"saved {a['subset'] or 'all documents'}, now {b['subset'] or 'all documents'}",
                "resume with the same data.val_source and data.val_fraction",
            )
        if a["bos"] != b["bos"]:
            saved, now_bos = (str(m["bos"] is not None).lower() for m in (a, b))
            return ("a different data.bos", f"saved data.bos={saved}, now {now_bos}", f"resume with data.bos={saved}")
    return None


def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One state from every rank's state (all of one run): load it on any number of ranks.

    Semantics: every virtual shard continues where it stopped, including a document that was cut
    mid-way (its rest is emitted first by its new rank), so within each epoch no document is
    skipped and none is repeated. The order in which a rank interleaves its shards changes, except
    on as many ranks as saved it: each takes its own state back ("ranks"), as if never merged.
    """
    states = sorted(states, key=lambda s: s["dp_rank"])
    size = states[0]["dp_size"]
    if sorted(s["dp_rank"] for s in states) != list(range(size)):
        raise ValueError(
            f"merge_states needs the states of all {size} ranks, got ranks {sorted(s['dp_rank'] for s in states)}"
        )
    merged = dict(states[0], dp_rank="all", dp_size="all", current=-1)
    merged["shards"] = [
        {v: p for s in states for v, p in s["shards"][k].items()} for k in range(len(states[0]["shards"]))
    ]
    merged["tokens_emitted"] = [
        sum(s["tokens_emitted"][k] for s in states) for k in range(len(states[0]["tokens_emitted"]))
    ]
    merged["rows"] = sum(s.get("rows", 0) for s in states)
    merged["empty_skipped"] = sum(s["empty_skipped"] for s in states)
    merged["bad_skipped"] = sum(s["bad_skipped"] for s in states)
    merged["ranks"] = states
    return merged
