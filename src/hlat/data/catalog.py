"""What ``data.source`` names, and opening it.

``data.source`` is one entry or a comma-separated mixture (weights in ``data.weights``). An entry is:
"" (the embedded standard-library corpus); ``hf:NAME`` (``datasets.load_dataset``, online only);
a directory made by ``hlat prepare`` (token shards); a ``datasets.save_to_disk`` directory; an
Arrow IPC file or stream (.arrow/.arrows/.ipc/.feather), Parquet, JSONL (.jsonl/.json/.ndjson,
optionally .gz/.zst); a directory of such files; or a text file / directory of text files.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Protocol

from hlat.data.records import RowSource, convert_to_arrow, file_fingerprint, read_arrow, text_column
from hlat.data.sources import _SKIP_DIRS, DocumentSource, StdlibCorpus, TextFiles, scan_text_files

ARROW_SUFFIXES = (".arrow", ".arrows", ".ipc", ".feather")
JSONL_SUFFIXES = tuple(s + c for s in (".jsonl", ".json", ".ndjson") for c in ("", ".gz", ".zst"))
SHARDS_MANIFEST = "manifest.json"


class SourceSettings(Protocol):
    """The fields of a data config that say how to read an entry (hlat.data.DataConfig has them)."""

    text_field: str
    bad_documents: str
    split: str
    hf_config: str

    def resolved_cache_dir(self) -> Path: ...


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
        return "rows" if _record_files(path) else "text"
    return file_kind(path) or "text"


def _record_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        found += [Path(dirpath) / f for f in filenames if not f.startswith(".") and file_kind(Path(f))]
    return sorted(found)


def check_source_path(entry: str) -> str | None:
    """None if the entry looks readable, else a message naming the fix (cheap: no data is read)."""
    if entry.startswith("hf:") or not entry:
        return None if entry != "hf:" else "hf: needs a dataset name, e.g. hf:allenai/c4"
    path = Path(entry).expanduser()
    if not path.exists():
        return (f"no such file or directory: {entry}; give a data file or directory, hf:NAME, or "
                "leave empty for the embedded corpus")
    if path.is_dir() and entry_kind(entry) == "text" and not scan_text_files(path):
        return (f"no data or text files under {entry}; give a directory of .arrow/.parquet/.jsonl "
                "or text files, or leave empty for the embedded corpus")
    return None


def open_entry(entry: str, cfg: SourceSettings) -> DocumentSource:
    """The document source of one data.source entry (not token shards: see hlat.data.shards)."""
    problem = check_source_path(entry)
    if problem:
        raise ValueError(problem)
    kind = entry_kind(entry)
    if kind == "stdlib":
        return StdlibCorpus()
    if kind == "text":
        return TextFiles(entry)
    if kind == "shards":
        raise ValueError(f"{entry} holds token shards made by `hlat prepare`, not documents")
    if kind in ("hub", "hf_disk"):
        return _open_hf(entry, kind, cfg)
    path = Path(entry).expanduser()
    files = _record_files(path) if kind == "rows" else [path]
    parts: list[tuple[str, object]] = []
    skipped = 0
    fps = []
    for f in files:
        k = file_kind(f)
        if k == "arrow":
            table, label = read_arrow(f), str(f)
        else:
            mapped, dropped = convert_to_arrow(f, k or "jsonl", cfg.text_field, cfg.bad_documents == "skip",
                                               cfg.resolved_cache_dir())
            table, label = read_arrow(mapped), str(f)
            skipped += dropped
        parts.append((label, text_column(table, cfg.text_field, str(f))))
        fps.append(file_fingerprint(f))
    what = f"{len(files)} files under {path}" if kind == "rows" else str(path)
    source = RowSource(parts, name=what, skipped=skipped,  # type: ignore[arg-type]
                       fingerprint=_fingerprint(kind, cfg.text_field, fps))
    if len(source) == 0:
        raise ValueError(f"{what} has no documents; give a source with at least one row")
    return source


def _fingerprint(kind: str, field: str, parts: list[str]) -> str:
    return f"{kind}-{len(parts)}-{hashlib.sha256('|'.join([field, *parts]).encode()).hexdigest()[:16]}"


def _open_hf(entry: str, kind: str, cfg: SourceSettings) -> DocumentSource:
    """A Hugging Face dataset: load_from_disk, or load_dataset by name (downloads; online only).
    Both are Arrow tables mapped from disk; a DatasetDict is narrowed to data.split."""
    import datasets

    if kind == "hub":
        ds = datasets.load_dataset(entry[3:], cfg.hf_config or None, split=cfg.split)
    else:
        ds = datasets.load_from_disk(str(Path(entry).expanduser()))
    if isinstance(ds, datasets.DatasetDict):
        if cfg.split not in ds:
            raise ValueError(f"{entry} has splits {', '.join(ds)}, not {cfg.split!r}; set data.split")
        ds = ds[cfg.split]
    column = text_column(ds.data.table, cfg.text_field, entry)
    indices = ds._indices.column(0).to_numpy() if ds._indices is not None else None
    fp = f"hf-{len(ds)}-{ds._fingerprint}-{cfg.text_field}"
    return RowSource([(entry, column)], name=f"dataset {entry} ({cfg.split})", fingerprint=fp, indices=indices)
