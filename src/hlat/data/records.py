"""Row sources: one document per row of a text column, read by memory map.

Arrow IPC files and streams (HLAT's format) and Hugging Face ``datasets`` directories are mapped
in place: opening one reads only the record-batch metadata, so a corpus larger than RAM is fine
and its pages are cached (and evicted) by the OS. Parquet and JSONL (plain, .gz, .zst) cannot be
read at random positions, so they are converted once, streaming and in bounded memory, to an Arrow
IPC file in the cache directory and mapped from there. A bad row (invalid JSON, missing or non-
string text field, non-UTF-8 bytes) stops the conversion with its file and line, or is dropped and
counted with data.bad_documents=skip; a corrupt or truncated file is always an error.
"""

from __future__ import annotations

import bisect
import gzip
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from hlat.atomic_files import atomic_path, write_atomic
from hlat.data.sources import BadDocument, decode_windows
from hlat.digests import short_sha256
from hlat.errors import DataError

log = logging.getLogger(__name__)

_CONVERT_RECIPE = "rows-v1"  # bump when the conversion changes, so old caches are not reused
_BATCH_ROWS = 8192
_BATCH_BYTES = 32 << 20


def file_fingerprint(path: Path) -> str:
    """Name, size and the first and last MiB: cheap, and stable when the data is copied."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        sampled = f"{path.name}\0{size}".encode() + f.read(1 << 20)
        if size > 2 << 20:
            f.seek(size - (1 << 20))
            sampled += f.read()
    return short_sha256(sampled)


class RowSource:
    """Documents in a text column of one or more memory-mapped Arrow tables (one per file)."""

    def __init__(
        self,
        parts: list[tuple[str, pa.ChunkedArray]],
        name: str,
        fingerprint: str,
        indices: Any = None,
        skipped: int = 0,
    ):
        self.name = name
        self.skipped_rows = skipped  # rows dropped while converting (data.bad_documents=skip)
        self._fingerprint = fingerprint
        self._indices = indices  # an optional row mapping (a shuffled/selected HF dataset)
        self._files: list[str] = []
        self._chunks: list[pa.Array] = []
        self._chunk_file: list[int] = []
        self._starts = [0]  # global row of each chunk's first row
        self._file_starts: list[int] = []
        for k, (label, column) in enumerate(parts):
            self._files.append(label)
            self._file_starts.append(self._starts[-1])
            for chunk in column.chunks:
                if len(chunk):
                    self._chunks.append(chunk)
                    self._chunk_file.append(k)
                    self._starts.append(self._starts[-1] + len(chunk))
        self._binary = any(pa.types.is_binary(c.type) or pa.types.is_large_binary(c.type) for c in self._chunks)

    def __len__(self) -> int:
        return len(self._indices) if self._indices is not None else self._starts[-1]

    def _locate(self, i: int) -> tuple[int, int]:
        """(chunk, global row) of document i."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"document {i} out of range for {n} documents")
        row = int(self._indices[i]) if self._indices is not None else i % n
        return bisect.bisect_right(self._starts, row) - 1, row

    def __getitem__(self, i: int) -> str:
        k, row = self._locate(i)
        value = self._chunks[k][row - self._starts[k]]
        if not value.is_valid:
            raise self._bad(k, row, "the text field is null")
        try:
            text = value.as_py()
            return text.decode("utf-8") if self._binary else text
        except UnicodeDecodeError as e:
            raise self._bad(k, row, f"not UTF-8 ({e.reason} at byte {e.start})") from None

    def _extent(self, k: int, row: int) -> tuple[int, int] | None:
        """Where the row's bytes lie in its chunk's data buffer; None for a null row or a column
        without offsets (string views), which are read whole."""
        chunk = self._chunks[k]
        if len(chunk.buffers()) != 3 or not chunk[row - self._starts[k]].is_valid:
            return None
        dtype = np.int64 if pa.types.is_large_string(chunk.type) or pa.types.is_large_binary(chunk.type) else np.int32
        j = chunk.offset + row - self._starts[k]
        a, b = np.frombuffer(chunk.buffers()[1], dtype)[j : j + 2]
        return int(a), int(b)

    def text_size(self, i: int) -> int | None:
        """The document's size in bytes, read from the column's offsets (no text is read)."""
        extent = self._extent(*self._locate(i))
        return None if extent is None else extent[1] - extent[0]

    def text_windows(self, i: int, window: int) -> Iterator[str]:
        """The document's text decoded ``window`` bytes at a time from the mapped buffer (a huge
        row streams: no copy of it is made). ``"".join`` of it is ``self[i]``."""
        k, row = self._locate(i)
        extent = self._extent(k, row)
        if extent is None:
            yield self[i]
            return
        data = memoryview(self._chunks[k].buffers()[2])
        a, b = extent
        blocks = (bytes(data[p : min(p + window, b)]) for p in range(a, b, window))
        yield from decode_windows(blocks, True, lambda e, at: self._bad(k, row, f"not UTF-8 ({e.reason} at byte {at})"))

    def _bad(self, chunk: int, row: int, why: str) -> BadDocument:
        f = self._chunk_file[chunk]
        return BadDocument(
            f"{self._files[f]}, row {row - self._file_starts[f]}: {why}; fix the data or set data.bad_documents=skip"
        )

    def fingerprint(self) -> str:
        return self._fingerprint

    def __repr__(self) -> str:
        return f"RowSource({self.name!r}, {len(self)} documents)"


def text_column(table: pa.Table, field: str, where: str) -> pa.ChunkedArray:
    if field not in table.column_names:
        raise DataError(
            f"{where} has no column {field!r} (columns: {', '.join(table.column_names)}); "
            "set data.text_field to the column that holds the documents"
        )
    column = table.column(field)
    t = column.type
    if not (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or (hasattr(pa.types, "is_string_view") and pa.types.is_string_view(t))
    ):
        raise DataError(f"{where}: column {field!r} has type {t}, not text; set data.text_field to a string column")
    return column


def read_arrow(path: Path) -> pa.Table:
    """An Arrow IPC file or stream, memory-mapped (zero copy for uncompressed buffers)."""
    try:
        source = pa.memory_map(str(path))
        with open(path, "rb") as f:
            is_file_format = f.read(6) == b"ARROW1"
        reader = ipc.open_file(source) if is_file_format else ipc.open_stream(source)
        return reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise DataError(
            f"cannot read {path} as Arrow IPC (file or stream): it is corrupt or "
            f"truncated ({e}); re-create or re-download it"
        ) from e


# ---- conversion of Parquet and JSONL into a mapped Arrow file ------------------------------------


def _open_compressed(path: Path) -> IO[bytes]:
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".zst"):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


def _jsonl_rows(path: Path, field: str, skip: bool, bad: list[str]) -> Iterator[str]:
    line_no = 0
    try:
        with _open_compressed(path) as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                    if not isinstance(obj, dict) or field not in obj:
                        raise BadDocument(f"no field {field!r} (set data.text_field)")
                    text = obj[field]
                    if not isinstance(text, str):
                        raise BadDocument(f"field {field!r} is {type(text).__name__}, not a string")
                except (ValueError, BadDocument) as e:  # JSONDecodeError/UnicodeDecodeError are ValueErrors
                    why = "not UTF-8" if isinstance(e, UnicodeDecodeError) else str(e)
                    msg = f"{path}, line {line_no}: {why}"
                    if not skip:
                        raise BadDocument(f"{msg}; fix the data or set data.bad_documents=skip") from None
                    bad.append(msg)
                    continue
                yield text
    except Exception as e:  # truncated gzip (EOFError), bad gzip/zstd frames, I/O errors
        if isinstance(e, BadDocument) or not isinstance(e, (EOFError, OSError)) and type(e).__name__ != "ZstdError":
            raise
        raise DataError(
            f"cannot read {path} after line {line_no}: the file is corrupt or "
            f"truncated ({type(e).__name__}: {e}); re-create or re-download it"
        ) from e


def _parquet_rows(path: Path, field: str, skip: bool, bad: list[str]) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(str(path))
        if field not in pf.schema_arrow.names:
            raise DataError(
                f"{path} has no column {field!r} (columns: {', '.join(pf.schema_arrow.names)}); "
                "set data.text_field to the column that holds the documents"
            )
        row = 0
        for batch in pf.iter_batches(columns=[field], batch_size=_BATCH_ROWS):
            for value in batch.column(0).to_pylist():
                if isinstance(value, bytes):
                    try:
                        value = value.decode("utf-8")
                    except UnicodeDecodeError:
                        value = BadDocument("not UTF-8")
                if not isinstance(value, str):
                    why = (
                        "null text"
                        if value is None
                        else str(value)
                        if isinstance(value, BadDocument)
                        else f"{type(value).__name__}, not text"
                    )
                    msg = f"{path}, row {row}: {why}"
                    if not skip:
                        raise BadDocument(f"{msg}; fix the data or set data.bad_documents=skip")
                    bad.append(msg)
                else:
                    yield value
                row += 1
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise DataError(
            f"cannot read {path} as Parquet: it is corrupt or truncated ({e}); re-create or re-download it"
        ) from e


def convert_to_arrow(path: Path, kind: str, field: str, skip: bool, cache_dir: Path) -> tuple[Path, int]:
    """The mapped Arrow copy of a Parquet/JSONL file (made once, atomically); and rows dropped."""
    key = f"{_CONVERT_RECIPE}|{file_fingerprint(path)}|{field}|{skip}"
    out = cache_dir / "sources" / f"{path.name}-{short_sha256(key)}.arrow"
    skipped_file = out.with_suffix(".skipped")
    if out.is_file() and skipped_file.is_file():  # the count is written last: the pair is complete
        return out, int(skipped_file.read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    bad: list[str] = []
    rows = (_parquet_rows if kind == "parquet" else _jsonl_rows)(path, field, skip, bad)
    schema = pa.schema([(field, pa.large_string())])
    with atomic_path(out) as tmp, ipc.new_file(str(tmp), schema) as writer:
        batch: list[str] = []
        size, written = 0, False
        for text in rows:
            batch.append(text)
            size += len(text)
            if len(batch) >= _BATCH_ROWS or size >= _BATCH_BYTES:
                writer.write_batch(pa.record_batch([pa.array(batch, pa.large_string())], schema=schema))
                batch, size, written = [], 0, True
        if batch or not written:
            writer.write_batch(pa.record_batch([pa.array(batch, pa.large_string())], schema=schema))
    write_atomic(skipped_file, str(len(bad)))
    if bad:
        log.warning("%s: skipped %d bad rows (data.bad_documents=skip), e.g. %s", path, len(bad), "; ".join(bad[:3]))
    return out, len(bad)
