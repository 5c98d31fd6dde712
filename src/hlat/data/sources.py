"""Document sources: random access to raw text documents by index.

A source is anything with ``len(source)``, ``source[i] -> str``, a human ``name`` and a stable
``fingerprint()`` (used as a cache key and to refuse resuming a loader on different data). The
loader only ever asks for documents by index, so Arrow/Parquet/JSONL/HF-datasets sources (rows
with a ``text`` field) slot in by implementing the same four members.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from hlat.data.config import DataConfig

# Files read as plain text documents when they sit in a source directory.
TEXT_SUFFIXES = frozenset(
    {
        ".txt", ".text", ".md", ".markdown", ".rst", ".tex", ".py", ".pyi", ".c", ".h", ".cc",
        ".cpp", ".hpp", ".java", ".js", ".ts", ".go", ".rs", ".rb", ".sh", ".html", ".css",
        ".toml", ".yaml", ".yml", ".cfg", ".ini",
    }
)  # fmt: skip

# Data formats that later sources will read; until then they are refused with a clear message.
LATER_FORMATS = {
    ".parquet": "Parquet",
    ".arrow": "Arrow",
    ".jsonl": "JSONL",
    ".json": "JSON/JSONL",
    ".gz": "compressed",
    ".zst": "compressed",
    ".bz2": "compressed",
    ".xz": "compressed",
    ".bin": "pre-tokenized memmap shard",
    ".npy": "pre-tokenized memmap shard",
}
# In a directory, a stray .json (a config, a package.json) is just skipped; these are refused.
_LATER_IN_DIRECTORY = frozenset(LATER_FORMATS) - {".json"}
_SKIP_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages"})


@runtime_checkable
class DocumentSource(Protocol):
    """Random access to raw text documents."""

    name: str  # human description, used in logs ("the Python 3.11 standard library")

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> str: ...

    def fingerprint(self) -> str:
        """A stable identity of the documents (same data, same string, on every machine)."""
        ...


def _later_message(path: Path, kind: str) -> str:
    return (
        f"{path}: {kind} sources are not supported yet (they come in a later release); "
        "for now give a plain text file, a directory of text files, or leave empty for the "
        "embedded corpus"
    )


def _scan_directory(root: Path) -> tuple[list[str], list[str]]:
    """Sorted relative paths of text files under root, and of files in formats that come later."""
    texts: list[str] = []
    later: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for fname in filenames:
            if fname.startswith("."):
                continue
            suffix = Path(fname).suffix.lower()
            rel = os.path.relpath(os.path.join(dirpath, fname), root)
            if suffix in TEXT_SUFFIXES:
                texts.append(rel)
            elif suffix in _LATER_IN_DIRECTORY:
                later.append(rel)
    texts.sort()
    later.sort()
    return texts, later


def check_source_path(source: str) -> str | None:
    """None if ``source`` can be read as text documents, else a message naming the fix."""
    path = Path(source).expanduser()
    if not path.exists():
        return (
            f"no such file or directory: {source}; give a path to a text file/directory or leave "
            "empty for the embedded corpus"
        )
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in LATER_FORMATS:
            return _later_message(path, LATER_FORMATS[suffix])
        return None
    texts, later = _scan_directory(path)
    if later:
        kind = LATER_FORMATS[Path(later[0]).suffix.lower()]
        return _later_message(path / later[0], kind) + f" ({len(later)} such files under {path})"
    if not texts:
        return (
            f"no text files under {source} (looked for {', '.join(sorted(TEXT_SUFFIXES))}); give "
            "a directory of text files or leave empty for the embedded corpus"
        )
    return None


class _Files:
    """Documents that are whole files under a root directory, read lazily."""

    name: str

    def __init__(self, root: Path, relpaths: list[str], kind: str):
        self.root = root
        self.relpaths = relpaths
        self._kind = kind
        self._fingerprint: str | None = None

    def __len__(self) -> int:
        return len(self.relpaths)

    def __getitem__(self, i: int) -> str:
        if not -len(self.relpaths) <= i < len(self.relpaths):
            raise IndexError(f"document {i} out of range for {len(self.relpaths)} documents")
        return (self.root / self.relpaths[i]).read_bytes().decode("utf-8", errors="replace")

    def path(self, i: int) -> Path:
        return self.root / self.relpaths[i]

    def fingerprint(self) -> str:
        # Relative paths and sizes: cheap (one stat per file), and stable when the data is copied to
        # another machine (mtimes are not). An edit that keeps a file's size is not detected.
        if self._fingerprint is None:
            h = hashlib.sha256(f"{self._kind}\n".encode())
            for rel in self.relpaths:
                h.update(f"{rel}\0{(self.root / rel).stat().st_size}\n".encode())
            self._fingerprint = f"{self._kind}-{len(self.relpaths)}-{h.hexdigest()[:16]}"
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
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
            for fname in filenames:
                if fname.endswith(".py"):
                    relpaths.append(os.path.relpath(os.path.join(dirpath, fname), root_path))
        relpaths.sort()
        if not relpaths:
            raise RuntimeError(
                f"found no .py files under {root_path}; this Python has no standard library "
                "sources (some minimal images strip them): give data.source a text corpus instead"
            )
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        super().__init__(root_path, relpaths, kind=f"stdlib{version}")
        self.name = f"the Python {version} standard library"


class TextFiles(_Files):
    """A plain text file (one document) or a directory of text files (one document per file,
    sorted by relative path)."""

    def __init__(self, path: str | os.PathLike):
        p = Path(path).expanduser()
        problem = check_source_path(str(p))
        if problem:
            raise ValueError(problem)
        if p.is_file():
            super().__init__(p.parent, [p.name], kind="textfile")
            self.name = f"text file {p}"
        else:
            texts, _ = _scan_directory(p)
            super().__init__(p, texts, kind="textfiles")
            self.name = f"{len(texts)} text files under {p}"


def open_source(cfg: DataConfig) -> DocumentSource:
    """The document source a DataConfig names ("" = the embedded standard-library corpus)."""
    if not cfg.source:
        return StdlibCorpus()
    return TextFiles(cfg.source)
