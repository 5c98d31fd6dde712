"""Documents as the token sequences they add to the stream: tokenized online, or read from shards.

Both providers give, for a source index, the document's tokens followed by one EOS (no BOS), an
empty array for a blank document, or the ``BadDocument`` that reading it raised. Their
``fingerprint()`` names the source, the tokenizer and the splitting, so a loader state saved on
the online path resumes on shards of the same data and back.
"""

from __future__ import annotations

from typing import Protocol, Union, runtime_checkable

import numpy as np

from hlat.data.sources import BadDocument, DocumentSource

DocTokens = Union[np.ndarray, BadDocument]
_EMPTY = np.empty(0, dtype=np.int64)


@runtime_checkable
class DocumentTokens(Protocol):
    name: str
    eos_id: int

    def __len__(self) -> int: ...

    def tokens(self, indices: list[int]) -> list[DocTokens]: ...

    def fingerprint(self) -> str: ...


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


def tokens_fingerprint(source_fp: str, tokenizer_fp: str, max_doc_chars: int) -> str:
    return f"{source_fp}|tok={tokenizer_fp}|split={max_doc_chars}"


class OnlineDocuments:
    """Reads documents from a source and tokenizes them in one batched (Rust, multi-threaded) call."""

    def __init__(self, source: DocumentSource, tokenizer, max_doc_chars: int = 100_000):
        if max_doc_chars < 1:
            raise ValueError(f"max_doc_chars={max_doc_chars} must be positive")
        self.source = source
        self.tokenizer = tokenizer
        self.max_doc_chars = max_doc_chars
        self.name = source.name
        self.eos_id: int = tokenizer.eos_id
        self._fingerprint = tokens_fingerprint(source.fingerprint(), tokenizer.fingerprint(), max_doc_chars)

    def __len__(self) -> int:
        return len(self.source)

    def fingerprint(self) -> str:
        return self._fingerprint

    def texts(self, indices: list[int]) -> list[str | BadDocument]:
        out: list[str | BadDocument] = []
        for i in indices:
            try:
                out.append(self.source[i])
            except BadDocument as e:
                out.append(e)
        return out

    def tokens(self, indices: list[int]) -> list[DocTokens]:
        return self.encode(self.texts(indices))

    def encode(self, texts: list[str | BadDocument]) -> list[DocTokens]:
        pieces: list[str] = []
        counts: list[int] = []
        for text in texts:
            if isinstance(text, str) and text.strip():
                parts = split_document(text, self.max_doc_chars)
                pieces.extend(parts)
                counts.append(len(parts))
            else:
                counts.append(0)
        ids = self.tokenizer.encode_batch(pieces)
        out: list[DocTokens] = []
        k = 0
        for text, c in zip(texts, counts):
            if c == 0:
                out.append(text if isinstance(text, BadDocument) else _EMPTY)
                continue
            arr = np.empty(sum(len(p) for p in ids[k : k + c]) + 1, dtype=np.int64)
            pos = 0
            for part in ids[k : k + c]:
                arr[pos : pos + len(part)] = part
                pos += len(part)
            arr[-1] = self.eos_id
            out.append(arr)
            k += c
        return out
