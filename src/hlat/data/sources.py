"""Document sources: random access to raw text documents by index.

A source is anything with ``len(source)``, ``source[i] -> str``, a human ``name`` and a stable
``fingerprint()`` (used as a cache key and to refuse resuming a loader on different data). The
loader only ever asks for documents by index. A source may also offer ``text_size(i)`` (bytes) and
``text_windows(i, window)`` (the text decoded a window at a time), so that a huge document is
streamed rather than read whole (see documents.py); text files and row sources do. Text files live here; row formats (Arrow, Parquet,
JSONL, Hugging Face datasets) in ``records.py``; ``catalog.py`` picks one for a path.
"""

from __future__ import annotations

import bisect
import codecs
import os
import stat
import sys
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

from hlat.config.data_paths import SKIP_DIRS, TEXT_SUFFIXES, scan_text_files, special_file
from hlat.digests import short_sha256
from hlat.errors import DataError


class BadDocument(DataError):
    """A document that cannot be read (bad UTF-8, no text field, ...). The message names the file
    and the row. The loader raises it, or counts and logs a skip when data.bad_documents=skip."""


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``open(path, "rb")`` of a regular file only, else DataError naming it: opened without
    blocking (O_NONBLOCK: a FIFO swapped in after a check cannot hang the open) and checked on the
    open descriptor, so a FIFO or device is never read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DataError(special_file(path) or f"{path} is not a regular file; give a regular file")
    return os.fdopen(fd, "rb")


@runtime_checkable
class DocumentSource(Protocol):
    """Random access to raw text documents."""

    name: str  # human description, used in logs ("the Python 3.11 standard library")

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> str: ...

    def fingerprint(self) -> str:
        """A stable identity of the documents (same data, same string, on every machine)."""
        ...


def decode_windows(
    blocks: Iterable[bytes], strict: bool, bad: Callable[[UnicodeDecodeError, int], BadDocument]
) -> Iterator[str]:
    """Decode a document's bytes block by block: what ``bytes.decode`` of the whole gives, without
    holding it (a character cut at a block's end is carried into the next). ``bad(error, byte)``
    makes the BadDocument for invalid UTF-8 at that byte of the document."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict" if strict else "replace")
    start = 0
    for block in blocks:
        pending = len(decoder.getstate()[0])
        try:
            text = decoder.decode(block)
        except UnicodeDecodeError as e:
            raise bad(e, start - pending + e.start) from None
        start += len(block)
        if text:
            yield text
    try:
        tail = decoder.decode(b"", final=True)
    except UnicodeDecodeError as e:
        raise bad(e, start - len(decoder.getstate()[0]) + e.start) from None
    if tail:
        yield tail


class _Files:
    """Documents that are whole files under a root directory, read lazily."""

    name: str

    def __init__(self, root: Path, relpaths: list[str], kind: str, strict_utf8: bool = True):
        self.root = root
        self.relpaths = relpaths
        self._kind = kind
        self._strict = strict_utf8
        self._fingerprint: str | None = None

    def __len__(self) -> int:
        return len(self.relpaths)

    def __getitem__(self, i: int) -> str:
        with open_regular(self.path(i)) as f:
            data = f.read()
        if not self._strict:
            return data.decode("utf-8", errors="replace")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self._bad(i, e, e.start) from None

    def text_size(self, i: int) -> int:
        """The document's size in bytes (a stat: nothing is read)."""
        return self.path(i).stat().st_size

    def text_windows(self, i: int, window: int) -> Iterator[str]:
        """The document's text, read and decoded ``window`` bytes at a time: ``"".join`` of it is
        ``self[i]``, and no more than a window is held (a huge file streams)."""
        with open_regular(self.path(i)) as f:
            yield from decode_windows(
                iter(lambda: f.read(window), b""), self._strict, lambda e, at: self._bad(i, e, at)
            )

    def path(self, i: int) -> Path:
        if not -len(self.relpaths) <= i < len(self.relpaths):
            raise IndexError(f"document {i} out of range for {len(self.relpaths)} documents")
        return self.root / self.relpaths[i]

    def _bad(self, i: int, e: UnicodeDecodeError, at: int) -> BadDocument:
        return BadDocument(
            f"{self.root / self.relpaths[i]} (document {i}): not UTF-8 ({e.reason} at "
            f"byte {at}); re-encode the file as UTF-8 or set data.bad_documents=skip"
        )

    def fingerprint(self) -> str:
        # Relative paths and sizes: cheap (one stat per file), and stable when the data is copied to
        # another machine (mtimes are not). An edit that keeps a file's size is not detected.
        if self._fingerprint is None:
            sizes = "".join(f"{rel}\0{(self.root / rel).stat().st_size}\n" for rel in self.relpaths)
            listing = f"{self._kind}\n{sizes}"
            self._fingerprint = f"{self._kind}-{len(self.relpaths)}-{short_sha256(listing)}"
        return self._fingerprint

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r}, {len(self)} documents)"


class StdlibCorpus(_Files):
    """The embedded corpus: every ``*.py`` file of this Python's standard library (~1,800 files,
    ~30 MB on CPython 3.11), one document per file. Needs no download."""

    def __init__(self, root: str | os.PathLike | None = None):
        root_path = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
        relpaths: list[str] = []
        for dirpath, dirnames, filenames in os.walk(root_path):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            for fname in filenames:
                if fname.endswith(".py"):
                    relpaths.append(os.path.relpath(os.path.join(dirpath, fname), root_path))
        relpaths.sort()
        if not relpaths:
            raise DataError(
                f"found no .py files under {root_path}; this Python has no standard library "
                "sources (some minimal images strip them): give data.source a text corpus instead"
            )
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        # A handful of stdlib test modules are deliberately Latin-1/KOI8-R: replace, never fail.
        super().__init__(root_path, relpaths, kind=f"stdlib{version}", strict_utf8=False)
        self.name = f"the Python {version} standard library"


class TextFiles(_Files):
    """A plain text file (one document) or a directory of text files (one document per file,
    sorted by relative path). Files must be UTF-8 (a bad file raises BadDocument when read)."""

    def __init__(self, path: str | os.PathLike):
        p = Path(path).expanduser()
        if p.exists() and not p.is_dir() and (problem := special_file(p)):
            raise DataError(problem)
        if p.is_file():
            super().__init__(p.parent, [p.name], kind="textfile")
            self.name = f"text file {p}"
            return
        texts = scan_text_files(p) if p.is_dir() else []
        if not texts:
            raise DataError(
                f"no text files under {p} (looked for {', '.join(sorted(TEXT_SUFFIXES))}); give a "
                "directory of text files, a data file, or leave empty for the embedded corpus"
            )
        super().__init__(p, texts, kind="textfiles")
        self.name = f"{len(texts)} text files under {p}"


class Concat:
    """Several sources read as one (to train a tokenizer on every source of a mixture)."""

    def __init__(self, sources: list[DocumentSource]):
        self.sources = sources
        self.name = " + ".join(s.name for s in sources)
        self._starts = [0]
        for s in sources:
            self._starts.append(self._starts[-1] + len(s))

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, i: int) -> str:
        k = bisect.bisect_right(self._starts, i) - 1
        return self.sources[k][i - self._starts[k]]

    def fingerprint(self) -> str:
        return "+".join(s.fingerprint() for s in self.sources)
