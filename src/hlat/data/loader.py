"""Building the data pipeline from a DataConfig: tokenizer, training loader, validation batches."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hlat.config.data import DataConfig, default_cache_dir
from hlat.config.data_paths import entry_kind, source_entries
from hlat.data.batch import Batch
from hlat.data.catalog import open_entry
from hlat.data.documents import DocTokens, DocumentTokens, OnlineDocuments
from hlat.data.packing import PackedLoader
from hlat.data.shards import ShardDocuments, shard_tokenizer_path
from hlat.data.sources import Concat, DocumentSource
from hlat.data.tokenizer import BOS_CANDIDATES, build_tokenizer
from hlat.digests import short_sha256
from hlat.errors import ConfigError, DataError

VAL_SEED = 0  # validation always reads the same documents in the same order


class DocumentsSubset:
    """Some documents of a provider (what remains for training after a held-out split)."""

    def __init__(self, docs: DocumentTokens, indices: np.ndarray, label: str):
        self.docs, self.indices = docs, indices
        self.name = f"{label} of {docs.name}"
        self.eos_id = docs.eos_id
        digest = short_sha256(indices.tobytes(), 12)
        self._fingerprint = f"{docs.fingerprint()}[{label}:{digest}]"

    def __len__(self) -> int:
        return len(self.indices)

    def tokens(self, indices: list[int]) -> list[DocTokens]:
        return self.docs.tokens([int(self.indices[i]) for i in indices])

    def fingerprint(self) -> str:
        return self._fingerprint


def holdout_split(n: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) document indices: a fixed pseudo-random fraction (at least one)."""
    keys = np.array(
        [int.from_bytes(hashlib.blake2b(str(i).encode(), digest_size=4).digest(), "little") for i in range(n)],
        dtype=np.uint64,
    )
    val = keys < np.uint64(fraction * 2**32)
    if not val.any():
        val[int(np.argmin(keys))] = True
    return np.flatnonzero(~val), np.flatnonzero(val)


def tokenizer_corpus(cfg: DataConfig) -> DocumentSource | None:
    """What a byte-level BPE is trained on when data.tokenizer is empty: every document source."""
    entries = source_entries(cfg.source)
    sources = [open_entry(e, cfg.for_entry(i)) for i, e in enumerate(entries) if entry_kind(e) != "shards"]
    return None if not sources else sources[0] if len(sources) == 1 else Concat(sources)


def open_source(cfg: DataConfig) -> DocumentSource:
    """The documents data.source names, as one source (a mixture's entries concatenated; token
    shards excluded): what a BPE is trained on."""
    source = tokenizer_corpus(cfg)
    if source is None:
        raise DataError(f"data.source={cfg.source!r} holds only token shards, no documents")
    return source


def build_data_tokenizer(cfg: DataConfig, vocab_size: int) -> tuple[Any, str]:
    """data.tokenizer; else the tokenizer that token shards were made with; else a cached BPE.
    With data.bos, a tokenizer without BOS is refused here, at start-up."""
    first = source_entries(cfg.source)[0]
    if not cfg.tokenizer and entry_kind(first) == "shards":
        cfg = DataConfig(**{**cfg.__dict__, "tokenizer": str(shard_tokenizer_path(Path(first)))})
    tok, line = build_tokenizer(cfg, vocab_size, None if cfg.tokenizer else tokenizer_corpus(cfg))
    data_bos_id(cfg, tok)
    return tok, line


def data_bos_id(cfg: DataConfig, tokenizer: Any) -> int | None:
    """The BOS id that begins every packed document (data.bos), or None when data.bos is off."""
    if not cfg.bos:
        return None
    if tokenizer.bos_id is None:
        raise ConfigError(
            [
                (
                    "data.bos",
                    (
                        f"the tokenizer {tokenizer.origin} has no beginning-of-document token (looked for "
                        f"{', '.join(BOS_CANDIDATES)}; a SentencePiece model's bos_id); give data.tokenizer one "
                        "that has one (Llama 3's tokenizer.json has <|begin_of_text|>) or set data.bos=false"
                    ),
                )
            ]
        )
    return tokenizer.bos_id


def open_documents(cfg: DataConfig, tokenizer: Any) -> list[DocumentTokens]:
    """One token-document provider per data.source entry: online, or token shards."""
    out: list[DocumentTokens] = []
    for i, entry in enumerate(source_entries(cfg.source)):
        if entry_kind(entry) == "shards":
            out.append(ShardDocuments(Path(entry), tokenizer, cfg.bad_documents == "skip", default_cache_dir()))
        else:
            out.append(OnlineDocuments(open_entry(entry, cfg.for_entry(i)), tokenizer, cfg.max_doc_chars))
    return out


def _split(cfg: DataConfig, tokenizer: Any) -> tuple[list[DocumentTokens], DocumentTokens | None]:
    docs = open_documents(cfg, tokenizer)
    if cfg.val_source == "holdout":
        train, val = holdout_split(len(docs[0]), cfg.val_fraction)
        return [DocumentsSubset(docs[0], train, "training split"), *docs[1:]], DocumentsSubset(
            docs[0], val, "held-out split"
        )
    if cfg.val_source:
        # a separate validation source reads the first source's text field
        val_cfg = DataConfig(**{**cfg.__dict__, "source": cfg.val_source, "text_field": cfg.text_fields()[0]})
        (val,) = open_documents(val_cfg, tokenizer)
        return docs, val
    return docs, None


def build_loader(
    cfg: DataConfig,
    tokenizer: Any,
    *,
    seed: int,
    batch_size: int,
    dp_rank: int = 0,
    dp_size: int = 1,
    step_rows: int | None = None,
    log_fn: Callable[[str], None] | None = None,
    reader: str = "rank",
) -> PackedLoader:
    """The training loader of one data-parallel rank (without the held-out split, if any);
    `step_rows`: its rows per optimizer step (PackedLoader: each global batch's mixture);
    `reader`: what its start line calls the loader ("rank", or an elastic or deterministic run's
    "data share")."""
    docs, _ = _split(cfg, tokenizer)
    loader = PackedLoader(
        docs,
        tokenizer,
        seq_len=cfg.seq_len,
        batch_size=batch_size,
        seed=seed,
        dp_rank=dp_rank,
        dp_size=dp_size,
        weights=cfg.weight_list(),
        virtual_shards=cfg.shard_count(dp_size),
        document_masking=cfg.document_masking,
        mask_eos_target=cfg.mask_eos_target,
        bad_documents=cfg.bad_documents,
        bos_id=data_bos_id(cfg, tokenizer),
        log_fn=log_fn,
        step_rows=step_rows,
    )
    if log_fn is not None:
        shares = ", ".join(f"{d.name} x{w:g}" for d, w in zip(loader.docs, loader.weights))
        log_fn(f"data: {shares}; {reader} {dp_rank} of {dp_size} reads {loader.docs_per_epoch:,} documents per epoch")
    return loader


class Validation:
    """Validation batches: the same rows, from the same position, at every evaluation."""

    def __init__(
        self, cfg: DataConfig, tokenizer: Any, *, batch_size: int, num_batches: int, dp_rank: int = 0, dp_size: int = 1
    ):
        _, docs = _split(cfg, tokenizer)
        if docs is None:
            raise DataError("no validation data: set data.val_source to a source or to holdout")
        self.docs, self.tokenizer, self.cfg = docs, tokenizer, cfg
        self.batch_size, self.num_batches, self.dp_rank, self.dp_size = batch_size, num_batches, dp_rank, dp_size

    def batches(self) -> list[Batch]:
        loader = PackedLoader(
            self.docs,
            self.tokenizer,
            seq_len=self.cfg.seq_len,
            batch_size=self.batch_size,
            seed=VAL_SEED,
            dp_rank=self.dp_rank,
            dp_size=self.dp_size,
            virtual_shards=self.cfg.shard_count(self.dp_size),
            document_masking=self.cfg.document_masking,
            mask_eos_target=self.cfg.mask_eos_target,
            bad_documents=self.cfg.bad_documents,
            bos_id=data_bos_id(self.cfg, self.tokenizer),
            prefetch=False,
        )
        return [loader.next_batch() for _ in range(self.num_batches)]
