"""Documents as the token sequences they add to the stream: tokenized online, or read from shards.

Both providers give, for a source index, the document's tokens followed by one EOS (no BOS; with
``data.bos`` the packer wraps them in ``BosDocuments``, which puts a BOS in front), an empty array
for a blank document, or the ``BadDocument`` that reading it raised. A long document
(more than ``STREAM_CHARS`` bytes of text, or ``STREAM_TOKENS`` tokens in shards) comes as
``TokenPieces`` instead: its tokens in pieces, read, split and tokenized only as they are iterated,
so memory stays bounded whatever its size; the pieces join to exactly the array it would have
been. Their ``fingerprint()`` names the source, the tokenizer and the splitting, so a loader state
saved on the online path resumes on shards of the same data and back.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hlat.data.sources import BadDocument, DocumentSource

# A document longer than this many bytes is read, split and tokenized in windows of this many
# characters (each tokenizer call gets about this much text), one window at a time.
STREAM_CHARS = 1 << 18
# A document of more tokens than this is read from token shards in pieces of this many tokens.
STREAM_TOKENS = 1 << 18


class TokenPieces:
    """A long document's tokens, produced piece by piece each time it is iterated (the last piece
    ends with the EOS); nothing is read or tokenized before that."""

    def __init__(self, pieces: Callable[[], Iterator[np.ndarray]]):
        self._pieces = pieces

    def __iter__(self) -> Iterator[np.ndarray]:
        return self._pieces()

    def array(self) -> np.ndarray:
        """All the tokens at once (for inspection: this holds the whole document)."""
        return np.concatenate(list(self))


DocTokens = np.ndarray | BadDocument | TokenPieces
_EMPTY = np.empty(0, dtype=np.int64)


@runtime_checkable
class DocumentTokens(Protocol):
    name: str
    eos_id: int

    def __len__(self) -> int: ...

    def tokens(self, indices: list[int]) -> list[DocTokens]: ...

    def fingerprint(self) -> str: ...


def split_pieces(windows: Iterable[str], max_chars: int) -> Iterator[str]:
    """The pieces of the text that the windows join to: at most max_chars characters each, cut
    after the last newline in each window of max_chars when there is one (else at max_chars).
    Only the unsplit rest (under max_chars plus one window) is held."""
    buf, start = "", 0
    for window in windows:
        buf, start = buf[start:] + window, 0
        while len(buf) - start > max_chars:  # the cut looks only at the next max_chars characters
            cut = buf.rfind("\n", start, start + max_chars)
            end = cut + 1 if cut >= start else start + max_chars
            yield buf[start:end]
            start = end
    yield buf[start:]


def split_document(text: str, max_chars: int) -> list[str]:
    """Pieces of at most max_chars characters whose concatenation is text (see split_pieces)."""
    return list(split_pieces([text], max_chars))


def tokens_fingerprint(source_fp: str, tokenizer_fp: str, max_doc_chars: int) -> str:
    return f"{source_fp}|tok={tokenizer_fp}|split={max_doc_chars}"


class OnlineDocuments:
    """Reads documents from a source and tokenizes them in one batched (Rust, multi-threaded) call;
    a long document becomes ``TokenPieces`` that stream its text through the same splitting."""

    def __init__(self, source: DocumentSource, tokenizer: Any, max_doc_chars: int = 100_000):
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

    def tokens(self, indices: list[int]) -> list[DocTokens]:
        return self.encode([self._read(i) for i in indices])

    def _read(self, i: int) -> str | BadDocument | TokenPieces | np.ndarray:
        """The text of a document; a long one as TokenPieces (or _EMPTY when it is blank)."""
        try:
            size = self.source.text_size(i) if hasattr(self.source, "text_size") else None
            if size is not None and size > STREAM_CHARS:
                return self._long(lambda: self.source.text_windows(i, STREAM_CHARS))  # type: ignore[attr-defined]
            text = self.source[i]
            return self._long(lambda: iter([text])) if len(text) > STREAM_CHARS else text
        except BadDocument as e:
            return e

    def _long(self, windows: Callable[[], Iterator[str]]) -> TokenPieces | np.ndarray:
        # One pass over the text first: a bad byte anywhere refuses the document before any of its
        # tokens is emitted, and a blank one is skipped like any blank document.
        blank = True
        for window in windows():
            blank = blank and window.isspace()
        return _EMPTY if blank else TokenPieces(lambda: self._stream(split_pieces(windows(), self.max_doc_chars)))

    def _stream(self, pieces: Iterator[str]) -> Iterator[np.ndarray]:
        """Tokens of the pieces, one tokenizer call per ~STREAM_CHARS characters, then the EOS."""
        group: list[str] = []
        chars = 0
        for piece in pieces:
            group.append(piece)
            chars += len(piece)
            if chars >= STREAM_CHARS:
                yield self._join(self.tokenizer.encode_batch(group), 0)
                group, chars = [], 0
        yield self._join(self.tokenizer.encode_batch(group), 1)

    def _join(self, ids: list[list[int]], eos: int) -> np.ndarray:
        """The pieces' ids in one array, with room for ``eos`` EOS tokens at its end."""
        arr = np.empty(sum(len(p) for p in ids) + eos, dtype=np.int64)
        pos = 0
        for part in ids:
            arr[pos : pos + len(part)] = part
            pos += len(part)
        if eos:
            arr[-1] = self.eos_id
        return arr

    def encode(self, texts: list[str | BadDocument | TokenPieces | np.ndarray]) -> list[DocTokens]:
        """Tokens of each text (all pieces of all texts in one batched call); a BadDocument, blank
        array or TokenPieces passes through."""
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
                out.append(_EMPTY if isinstance(text, str) else text)
                continue
            out.append(self._join(ids[k : k + c], 1))
            k += c
        return out


class BosDocuments:
    """Another provider's documents, each begun with BOS (``data.bos``): BOS + tokens + EOS. A blank
    document stays empty and a BadDocument passes through. Shards hold no BOS, so the same shards
    serve both settings; the fingerprint names the BOS, so a loader state is resumed only with it."""

    def __init__(self, docs: DocumentTokens, bos_id: int):
        self.docs, self.bos_id = docs, bos_id
        self.name, self.eos_id = docs.name, docs.eos_id
        self._bos = np.array([bos_id], dtype=np.int64)
        self._fingerprint = f"{docs.fingerprint()}|bos={bos_id}"

    def __len__(self) -> int:
        return len(self.docs)

    def fingerprint(self) -> str:
        return self._fingerprint

    def tokens(self, indices: list[int]) -> list[DocTokens]:
        return [self._begin(t) for t in self.docs.tokens(indices)]

    def _begin(self, toks: DocTokens) -> DocTokens:
        if isinstance(toks, TokenPieces):  # the BOS is a piece of its own, ahead of the others
            return TokenPieces(lambda: itertools.chain([self._bos], toks))
        if isinstance(toks, np.ndarray) and len(toks):
            return np.concatenate([self._bos, toks])
        return toks
