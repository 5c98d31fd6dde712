"""Context parallelism's batches: each row cut into 2*cp chunks, cp rank r keeping chunks r and
2*cp-1-r (hlat.model.ring_attention explains the load balancing)."""

from __future__ import annotations

import torch

from hlat.data.batch import Batch
from hlat.model.ring_attention import chunk_ids


def shard_sequence(x: torch.Tensor, rank: int, cp: int) -> torch.Tensor:
    """This rank's load-balanced share of [B, T, ...] along T: chunks r and 2*cp-1-r, concatenated."""
    chunks = x.chunk(2 * cp, dim=1)
    return torch.cat([chunks[i] for i in chunk_ids(rank, cp)], dim=1)


def shard_batch(batch: Batch, rank: int, cp: int) -> Batch:
    """A batch's tokens, labels and positions cut to this cp rank's chunks. Labels were made on the
    whole row (the next token of a chunk's last position lies in the next chunk); positions are the
    tokens' places in the whole row, or in their document under document masking (RoPE)."""
    if batch.tokens.shape[1] % (2 * cp):  # hlat.config.layout.check_context_parallel refuses it first
        raise ValueError(f"context parallelism needs rows of a multiple of {2 * cp} tokens")
    positions = batch.positions
    if positions is None:
        positions = torch.arange(batch.tokens.shape[1], device=batch.tokens.device).expand_as(batch.tokens)
    doc_ids = None if batch.doc_ids is None else shard_sequence(batch.doc_ids, rank, cp)
    return Batch(
        shard_sequence(batch.tokens, rank, cp),
        shard_sequence(batch.labels, rank, cp),
        positions=shard_sequence(positions, rank, cp),
        doc_ids=doc_ids,
    )
