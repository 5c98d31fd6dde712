"""A training batch of packed rows, and the document masking derived from its EOS tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hlat.model.attention import AttentionMask, document_mask

IGNORE_INDEX = -100


@dataclass
class Batch:
    tokens: torch.Tensor  # int64 [B, T]
    labels: torch.Tensor  # int64 [B, T]: labels[:, t] = tokens[:, t+1], labels[:, T-1] = -100
    # With document masking: position of each token inside its document (restarting at every
    # document and at the start of each row), and the document number of each token in its row.
    positions: torch.Tensor | None = None  # int64 [B, T]
    doc_ids: torch.Tensor | None = None  # int64 [B, T]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return Batch(move(self.tokens), move(self.labels), move(self.positions), move(self.doc_ids))  # type: ignore[arg-type]

    def pin_memory(self) -> Batch:
        """A copy in page-locked host memory, which a non_blocking copy to CUDA reads asynchronously."""

        def pin(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.pin_memory()

        return Batch(pin(self.tokens), pin(self.labels), pin(self.positions), pin(self.doc_ids))  # type: ignore[arg-type]

    @property
    def attn_mask(self) -> AttentionMask:
        """Causal and same-document attention, built on the batch's device when asked for: a
        FlexAttention BlockMask on CUDA, else the bool mask [B, 1, T, T] (True = may attend)
        (hlat.model.attention.document_mask). None without document masking."""
        return document_mask(self.doc_ids)


def labels_for(tokens: torch.Tensor) -> torch.Tensor:
    """Next-token targets inside each row; the last position has none (IGNORE_INDEX)."""
    labels = torch.full_like(tokens, IGNORE_INDEX)
    labels[:, :-1] = tokens[:, 1:]
    return labels


def make_batch(tokens: torch.Tensor, eos_id: int, document_masking: bool, mask_eos_target: bool) -> Batch:
    """Labels, and with document masking the positions and document numbers: a document ends at
    its EOS (documents never contain EOS: only the packer emits it)."""
    labels = labels_for(tokens)
    if not document_masking:
        return Batch(tokens, labels)
    is_eos = tokens == eos_id
    doc_ids = torch.cumsum(is_eos, dim=1) - is_eos.long()  # the EOS belongs to its document
    idx = torch.arange(tokens.shape[1]).expand_as(tokens)
    # start of each token's document = index after the last EOS before it
    after_eos = torch.where(is_eos, idx + 1, torch.zeros_like(idx))
    starts = torch.cummax(torch.cat([torch.zeros_like(idx[:, :1]), after_eos[:, :-1]], dim=1), dim=1).values
    if mask_eos_target:
        labels = labels.masked_fill(is_eos, IGNORE_INDEX)  # EOS -> first token of an unrelated document
    return Batch(tokens, labels, positions=idx - starts, doc_ids=doc_ids)
