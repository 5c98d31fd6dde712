"""What a data path is, told from the filesystem alone (no data read): the kinds of data.source
entry, the text files of a directory, a directory's tokenizer file. DataConfig.validate asks them
before any work starts; hlat.data opens what they name."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hlat.errors import DataError

ARROW_SUFFIXES = (".arrow", ".arrows", ".ipc", ".feather")
JSONL_SUFFIXES = tuple(s + c for s in (".jsonl", ".json", ".ndjson") for c in ("", ".gz", ".zst"))
SHARDS_MANIFEST = "manifest.json"

# Files read as plain text documents when they sit in a source directory.
TEXT_SUFFIXES = frozenset(
    {
        ".txt", ".text", ".md", ".markdown", ".rst", ".tex", ".py", ".pyi", ".c", ".h", ".cc",
        ".cpp", ".hpp", ".java", ".js", ".ts", ".go", ".rs", ".rb", ".sh", ".html", ".css",
        ".toml", ".yaml", ".yml", ".cfg", ".ini",
    }
)  # fmt: skip

SKIP_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages"})

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")  # Tokenizer.FILE_NAME, SentencePieceTokenizer.FILE_NAME


_SPECIAL = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
            (stat.S_ISSOCK, "a socket"))  # fmt: skip


def special_file(path: str | os.PathLike) -> str | None:
    """None for a regular file (or a link to one), else a one-line refusal naming the path: a FIFO
    or device would block or read forever. A stat: the file is never opened."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"cannot read {path}: {e.strerror}; fix or remove it"
    if stat.S_ISREG(mode):
        return None
    what = next((name for test, name in _SPECIAL if test(mode)), "not a regular file")
    return f"{path} is {what}, not a regular file; hlat reads only regular files: remove it or give another path"


def _regular(path: Path) -> Path:
    problem = special_file(path)
    if problem:
        raise DataError(problem)
    return path


def find_tokenizer_file(directory: str | os.PathLike) -> Path | None:
    """The tokenizer file of a run, shard or model directory (tokenizer.json first), or None."""
    return next((Path(directory) / n for n in TOKENIZER_FILES if (Path(directory) / n).is_file()), None)


def source_entries(source: str) -> list[str]:
    return [e.strip() for e in source.split(",")] if source.strip() else [""]


def file_kind(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith(ARROW_SUFFIXES):
        return "arrow"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return None


def entry_kind(entry: str) -> str:
    """stdlib | hub | shards | hf_disk | arrow | parquet | jsonl | rows (a directory) | text."""
    if not entry:
        return "stdlib"
    if entry.startswith("hf:"):
        return "hub"
    path = Path(entry).expanduser()
    if path.is_dir():
        if (path / SHARDS_MANIFEST).is_file() and "hlat_shards" in (path / SHARDS_MANIFEST).read_text()[:200]:
            return "shards"
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return "hf_disk"
        return "rows" if record_files(path) else "text"
    return file_kind(path) or "text"


def record_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        found += [_regular(Path(dirpath) / f) for f in filenames if not f.startswith(".") and file_kind(Path(f))]
    return sorted(found)


def check_source_path(entry: str) -> str | None:
    """None if the entry looks readable, else a message naming the fix (cheap: no data is read)."""
    if entry.startswith("hf:") or not entry:
        return None if entry != "hf:" else "hf: needs a dataset name, e.g. hf:allenai/c4"
    path = Path(entry).expanduser()
    if not path.exists():
        return (
            f"no such file or directory: {entry}; give a data file or directory, hf:NAME, or "
            "leave empty for the embedded corpus"
        )
    if not path.is_dir():
        return special_file(path)
    try:
        if entry_kind(entry) == "text" and not scan_text_files(path):
            return (
                f"no data or text files under {entry}; give a directory of .arrow/.parquet/.jsonl "
                "or text files, or leave empty for the embedded corpus"
            )
    except DataError as e:  # a special file in the directory
        return str(e)
    return None


def scan_text_files(root: Path) -> list[str]:
    """Sorted relative paths of the text files under root (hidden entries and caches skipped)."""
    texts: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for fname in filenames:
            if not fname.startswith(".") and Path(fname).suffix.lower() in TEXT_SUFFIXES:
                _regular(Path(dirpath) / fname)
                texts.append(os.path.relpath(os.path.join(dirpath, fname), root))
    return sorted(texts)
