"""What ``data.source`` names, and opening it.

``data.source`` is one entry or a comma-separated mixture (weights in ``data.weights``). An entry is:
"" (the embedded standard-library corpus); ``hf:NAME`` (``datasets.load_dataset``, online only);
a directory made by ``hlat prepare`` (token shards); a ``datasets.save_to_disk`` directory; an
Arrow IPC file or stream (.arrow/.arrows/.ipc/.feather), Parquet, JSONL (.jsonl/.json/.ndjson,
optionally .gz/.zst); a directory of such files; or a text file / directory of text files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from hlat.config.data_paths import check_source_path, entry_kind, file_kind, record_files
from hlat.data.records import RowSource, convert_to_arrow, file_fingerprint, read_arrow, text_column
from hlat.data.sources import DocumentSource, StdlibCorpus, TextFiles
from hlat.digests import short_sha256
from hlat.errors import DataError


class SourceSettings(Protocol):
    """The fields of a data config that say how to read an entry (hlat.data.DataConfig has them)."""

    text_field: str
    bad_documents: str
    split: str
    hf_config: str

    def resolved_cache_dir(self) -> Path: ...


def open_entry(entry: str, cfg: SourceSettings) -> DocumentSource:
    """The document source of one data.source entry (not token shards: see hlat.data.shards)."""
    problem = check_source_path(entry)
    if problem:
        raise DataError(problem)
    kind = entry_kind(entry)
    if kind == "stdlib":
        return StdlibCorpus()
    if kind == "text":
        return TextFiles(entry)
    if kind == "shards":
        raise DataError(f"{entry} holds token shards made by `hlat prepare`, not documents")
    if kind in ("hub", "hf_disk"):
        return _open_hf(entry, kind, cfg)
    path = Path(entry).expanduser()
    files = record_files(path) if kind == "rows" else [path]
    parts: list[tuple[str, object]] = []
    skipped = 0
    fps = []
    for f in files:
        k = file_kind(f)
        if k == "arrow":
            table, label = read_arrow(f), str(f)
        else:
            mapped, dropped = convert_to_arrow(
                f, k or "jsonl", cfg.text_field, cfg.bad_documents == "skip", cfg.resolved_cache_dir()
            )
            table, label = read_arrow(mapped), str(f)
            skipped += dropped
        parts.append((label, text_column(table, cfg.text_field, str(f))))
        fps.append(file_fingerprint(f))
    what = f"{len(files)} files under {path}" if kind == "rows" else str(path)
    source = RowSource(
        parts,
        name=what,
        skipped=skipped,  # type: ignore[arg-type]
        fingerprint=_fingerprint(kind, cfg.text_field, fps),
    )
    if len(source) == 0:
        raise DataError(f"{what} has no documents; give a source with at least one row")
    return source


def _fingerprint(kind: str, field: str, parts: list[str]) -> str:
    return f"{kind}-{len(parts)}-{short_sha256('|'.join([field, *parts]))}"


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
            raise DataError(f"{entry} has splits {', '.join(ds)}, not {cfg.split!r}; set data.split")
        ds = ds[cfg.split]
    column = text_column(ds.data.table, cfg.text_field, entry)
    indices = ds._indices.column(0).to_numpy() if ds._indices is not None else None
    fp = f"hf-{len(ds)}-{ds._fingerprint}-{cfg.text_field}"
    return RowSource([(entry, column)], name=f"dataset {entry} ({cfg.split})", fingerprint=fp, indices=indices)
