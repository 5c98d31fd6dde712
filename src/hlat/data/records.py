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
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from hlat.atomic_files import atomic_path, write_atomic
from hlat.data.sources import BadDocument, decode_windows, open_regular
from hlat.digests import short_sha256
from hlat.errors import DataError

log = logging.getLogger(__name__)

_CONVERT_RECIPE = "rows-v1"  # bump when the conversion changes, so old caches are not reused
_BATCH_ROWS = 8192
_BATCH_BYTES = 32 << 20
# A JSONL line is parsed whole, so it is capped: a longer one is a bad document,
# read past in bounded pieces. Larger documents belong in text or Arrow files, which stream.
MAX_RECORD_BYTES = 64 << 20
_SKIP_PIECE = 1 << 20
# A Parquet row group's text column is decoded a page at a time, and a page can be as large as
# the column chunk, which the footer states before anything is decoded: a chunk over this cap
# (one huge value, or a writer's huge row group) is refused or skipped whole.
MAX_PARQUET_CHUNK_BYTES = 1 << 30


def file_fingerprint(path: Path) -> str:
    """Name, size and the first and last MiB: cheap, and stable when the data is copied."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
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
    for chunk in column.chunks:
        problem = _offsets_problem(chunk)
        if problem:
            raise DataError(f"{where}: column {field!r} is corrupt ({problem}); re-create or re-download it")
    return column


def _offsets_problem(chunk: pa.Array) -> str | None:
    """Why reading the chunk's rows could touch memory outside its buffers, or None. The buffer
    sizes (Array.validate) and every offset (non-decreasing, within the data) are checked: that is
    what reading needs, at 8 bytes a row, where validate(full=True) would also scan every byte of
    a mapped corpus for UTF-8 (checked per document when it is read)."""
    try:
        chunk.validate()
        buffers = chunk.buffers()
        if len(buffers) != 3 or buffers[1] is None:  # string views: references checked in full
            chunk.validate(full=True)
            return None
        wide = pa.types.is_large_string(chunk.type) or pa.types.is_large_binary(chunk.type)
        offsets = np.frombuffer(buffers[1], np.int64 if wide else np.int32)[
            chunk.offset : chunk.offset + len(chunk) + 1
        ]
    except pa.ArrowException as e:
        return str(e)
    data = 0 if buffers[2] is None else buffers[2].size
    if len(offsets) and (offsets[0] < 0 or offsets[-1] > data or bool(np.any(offsets[1:] < offsets[:-1]))):
        return f"its offsets leave the {data}-byte data buffer or decrease"
    return None


def read_arrow(path: Path) -> pa.Table:
    """An Arrow IPC file or stream, memory-mapped (zero copy for uncompressed buffers)."""
    try:
        with open_regular(path) as f:  # before mapping it: never a FIFO or device
            is_file_format = f.read(6) == b"ARROW1"
        source = pa.memory_map(str(path))
        reader = ipc.open_file(source) if is_file_format else ipc.open_stream(source)
        table = reader.read_all()
        table.validate()  # buffer sizes against the metadata; text offsets: text_column
        return table
    except (pa.ArrowInvalid, pa.ArrowIOError, pa.ArrowMemoryError, OSError) as e:
        raise DataError(
            f"cannot read {path} as Arrow IPC (file or stream): it is corrupt or "
            f"truncated ({e}); re-create or re-download it"
        ) from e


# ---- conversion of Parquet and JSONL into a mapped Arrow file ------------------------------------


@contextmanager
def _open_compressed(path: Path) -> Iterator[IO[bytes]]:
    name = path.name.lower()
    with open_regular(path) as raw:
        if name.endswith(".gz"):
            with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                yield f
        elif name.endswith(".zst"):
            import zstandard

            with io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw)) as f:
                yield f
        else:
            yield raw


def _capped_lines(f: IO[bytes]) -> Iterator[bytes | None]:
    """The file's lines, each None when longer than MAX_RECORD_BYTES (the rest of it is read in
    pieces and dropped, so no more than the cap is ever held)."""
    while line := f.readline(MAX_RECORD_BYTES + 1):
        if len(line) <= MAX_RECORD_BYTES or line.endswith(b"\n"):
            yield line
            continue
        yield None  # with bad_documents=error the reader stops here, else the rest is skipped
        while (piece := f.readline(_SKIP_PIECE)) and not piece.endswith(b"\n"):
            pass


def _jsonl_rows(path: Path, field: str, skip: bool, bad: list[str]) -> Iterator[str]:
    line_no = 0
    try:
        with _open_compressed(path) as f:
            for line_no, line in enumerate(_capped_lines(f), 1):
                if line is not None and not line.strip():
                    continue
                try:
                    if line is None:
                        raise BadDocument(f"longer than {MAX_RECORD_BYTES >> 20} MiB (the JSONL line cap)")
                    obj = json.loads(line)
                    if not isinstance(obj, dict) or field not in obj:
                        raise BadDocument(f"no field {field!r} (set data.text_field)")
                    text = obj[field]
                    if not isinstance(text, str):
                        raise BadDocument(f"field {field!r} is {type(text).__name__}, not a string")
                except (
                    ValueError,
                    BadDocument,
                    RecursionError,
                ) as e:  # JSONDecodeError/UnicodeDecodeError: ValueErrors
                    why = (
                        "not UTF-8"
                        if isinstance(e, UnicodeDecodeError)
                        else "JSON nested too deeply to parse"
                        if isinstance(e, RecursionError)
                        else str(e)
                    )
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


def _parquet_chunks(pf, field: str) -> Iterator[tuple[int, int, int]]:
    """(row group, its rows, the uncompressed bytes of its `field` column), from the footer."""
    meta = pf.metadata
    for group in range(meta.num_row_groups):
        rg = meta.row_group(group)
        chunk = sum(
            rg.column(c).total_uncompressed_size
            for c in range(rg.num_columns)
            if rg.column(c).path_in_schema.split(".")[0] == field
        )
        yield group, rg.num_rows, chunk


def _parquet_values(pf, field: str, group: int) -> Iterator[object]:
    for batch in pf.iter_batches(columns=[field], batch_size=_BATCH_ROWS, row_groups=[group]):
        yield from batch.column(0).to_pylist()


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
        for group, rows, chunk in _parquet_chunks(pf, field):
            if chunk > MAX_PARQUET_CHUNK_BYTES:
                msg = (
                    f"{path}, rows {row}-{row + rows - 1} (row group {group}): column {field!r} is "
                    f"{chunk >> 20} MiB uncompressed, over the {MAX_PARQUET_CHUNK_BYTES >> 20} MiB a row group "
                    "may hold"
                )
                if not skip:
                    raise BadDocument(f"{msg}; rewrite the file with smaller row groups or set data.bad_documents=skip")
                bad.append(msg)
                row += rows
                continue
            for value in _parquet_values(pf, field, group):
                if isinstance(value, bytes):
                    try:
                        value = value.decode("utf-8")
                    except UnicodeDecodeError:
                        value = BadDocument("not UTF-8")
                if isinstance(value, str) and len(value) > MAX_RECORD_BYTES:
                    value = BadDocument(f"longer than {MAX_RECORD_BYTES >> 20} MiB (the record cap)")
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
