"""Hostile data files: corrupt Arrow offsets, a huge compressed JSONL line, deep JSON nesting and
special files in a data directory are one-line DataErrors (or skips), never a crash, a hang or
unbounded memory. The cases that could crash or hang run in a bounded subprocess."""

from __future__ import annotations

import gzip
import json
import os
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from containment import PEAK_RSS, peak_mib, run_bounded
from hlat.config.data import DataConfig
from hlat.data import BadDocument, open_entry
from hlat.errors import DataError

OPEN = """
from hlat.config.data import DataConfig
from hlat.data import open_entry
from hlat.errors import DataError
for k, (entry, bad) in enumerate({cases!r}):
    try:
        src = open_entry(entry, DataConfig(cache_dir=f"{cache}/{{k}}", bad_documents=bad))
        print("docs", [len(src[i]) for i in range(len(src))], "skipped", src.skipped_rows)
    except DataError as e:
        print("DataError", e)
"""


FIFO_FIX = "hlat reads only regular files: remove it or give another path"


def open_bounded(tmp_path, cases, prelude="", timeout=60):
    """What open_entry gives for each (entry, bad_documents), a line each, in one bounded process."""
    cases = [(str(entry), bad) for entry, bad in cases]
    code = prelude + OPEN.format(cases=cases, cache=str(tmp_path / "cache")) + PEAK_RSS
    proc = run_bounded(code, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    return proc


def test_arrow_offsets_past_the_data_are_refused_naming_the_file(tmp_path):
    table = pa.table({"text": pa.array(["hello world"] * 4 + ["x" * 100], pa.string())})
    with ipc.new_file(str(tmp_path / "ok.arrow"), table.schema) as w:
        w.write_table(table)
    data = bytearray((tmp_path / "ok.arrow").read_bytes())
    offsets = np.array([0, 11, 22, 33, 44, 144], np.int32).tobytes()
    at = data.find(offsets)
    names = {"past.arrow": (20, 1 << 30), "back.arrow": (8, 40)}  # the last offset past the data; one decreasing
    for name, (where, value) in names.items():
        bad = bytearray(data)
        bad[at + where : at + where + 4] = np.int32(value).tobytes()
        (tmp_path / name).write_bytes(bytes(bad))
    out = open_bounded(tmp_path, [(tmp_path / n, "error") for n in names]).stdout  # used to crash (SIGBUS)
    lines = out.splitlines()[:2]
    for name, line in zip(names, lines):
        assert line.startswith("DataError") and str(tmp_path / name) in line, out
        assert "corrupt" in line and line.endswith("re-create or re-download it"), out


def _gzip_member(data: bytes) -> bytes:
    c = zlib.compressobj(1, zlib.DEFLATED, 31)  # wbits 31: a gzip member
    return c.compress(data) + c.flush()


def test_a_huge_compressed_jsonl_line_is_capped_in_bounded_memory(tmp_path):
    # 256 MiB of one line in ~300 KB: concatenated gzip members decompress to their concatenation.
    mib = _gzip_member(b"a" * (1 << 20))
    with open(tmp_path / "huge.jsonl.gz", "wb") as f:
        f.write(_gzip_member(b'{"text": "'))
        for _ in range(256):
            f.write(mib)
        f.write(_gzip_member(b'"}\n{"text": "fine"}\n'))
    cap = "import hlat.data.records as r; r.MAX_RECORD_BYTES = 1 << 20\n"  # the default (64 MiB) is slower to pass
    # the peak once everything is imported, printed first: reading may add to it only what the cap allows
    imported = "import hlat.data, hlat.config.data, hlat.errors\n" + PEAK_RSS + "\n"
    cases = [(tmp_path / "huge.jsonl.gz", "skip"), (tmp_path / "huge.jsonl.gz", "error")]
    proc = open_bounded(tmp_path, cases, cap + imported)
    baseline, skipped, refused = proc.stdout.splitlines()[:3]
    assert skipped == "docs [4] skipped 1", proc.stdout
    assert "huge.jsonl.gz, line 1: longer than 1 MiB" in refused and "bad_documents=skip" in refused, refused
    grown = peak_mib(proc) - int(baseline.split()[1])
    assert grown < 128, proc.stdout  # the line alone is 256 MiB, its str as much again


def test_deeply_nested_json_is_a_bad_document(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n" + json.dumps({"text": "fine"}) + "\n")
    src = open_entry(str(path), DataConfig(cache_dir=str(tmp_path / "c1"), bad_documents="skip"))
    assert [src[i] for i in range(len(src))] == ["fine"] and src.skipped_rows == 1
    with pytest.raises(BadDocument, match=r"deep\.jsonl, line 1: JSON nested too deeply"):
        open_entry(str(path), DataConfig(cache_dir=str(tmp_path / "c2")))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_in_a_data_directory_is_refused_without_opening_it(tmp_path):
    entries = []
    for kind, name, text in (("rows", "b.jsonl", json.dumps({"text": "fine"})), ("text", "b.txt", "fine")):
        data = tmp_path / kind
        data.mkdir()
        (data / ("a" + name[1:])).write_text(text + "\n")
        os.mkfifo(data / name)  # opening it for reading would block until a writer comes: forever
        entries += [(data, data / name), (data / name, data / name)]
    out = open_bounded(tmp_path, [(entry, "error") for entry, _ in entries], timeout=30).stdout
    for (entry, fifo), line in zip(entries, out.splitlines()):
        assert line == f"DataError {fifo} is a FIFO, not a regular file; {FIFO_FIX}", (entry, out)
        problems = DataConfig(source=str(entry), cache_dir=str(tmp_path / "cache")).validate()
        assert ("source", f"{fifo} is a FIFO, not a regular file; {FIFO_FIX}") in problems, problems


def test_a_character_device_is_refused(tmp_path):
    with pytest.raises(DataError, match="/dev/zero is a character device"):
        open_entry("/dev/zero", DataConfig(cache_dir=str(tmp_path / "cache")))


def test_gzip_and_plain_lines_at_the_cap_still_read(tmp_path, monkeypatch):
    import hlat.data.records as records

    monkeypatch.setattr(records, "MAX_RECORD_BYTES", 64)
    line = json.dumps({"text": "x" * 50}).encode()  # 63 bytes, the newline makes 64
    for name, opener in (("p.jsonl", open), ("g.jsonl.gz", gzip.open)):
        with opener(tmp_path / name, "wb") as f:
            f.write(line + b"\n" + line)  # the last line without a newline
        src = open_entry(str(tmp_path / name), DataConfig(cache_dir=str(tmp_path / f"cache-{name}")))
        assert [src[i] for i in range(len(src))] == ["x" * 50] * 2


def test_a_parquet_row_group_over_the_cap_is_refused_or_skipped_before_decoding(tmp_path, monkeypatch):
    """The footer's uncompressed size bounds what decoding a row group's text column can take; a
    group over the cap (here one huge value, the cap lowered) is never decoded."""
    import pyarrow.parquet as pq

    import hlat.data.records as records

    monkeypatch.setattr(records, "MAX_PARQUET_CHUNK_BYTES", 4096)
    path = tmp_path / "docs.parquet"
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())]), compression="zstd") as w:
        w.write_table(pa.table({"text": ["small one", "small two"]}))
        w.write_table(pa.table({"text": ["y" * 100_000]}))  # compresses to ~30 bytes on disk
        w.write_table(pa.table({"text": ["small three"]}))
    decoded = []
    real = records._parquet_values
    monkeypatch.setattr(records, "_parquet_values", lambda pf, f, g: decoded.append(g) or real(pf, f, g))
    with pytest.raises(DataError, match=r"docs.parquet, rows 2-2 \(row group 1\): column 'text' is 0 MiB"):
        open_entry(str(path), DataConfig(cache_dir=str(tmp_path / "cache-error")))
    assert 1 not in decoded
    src = open_entry(str(path), DataConfig(cache_dir=str(tmp_path / "cache-skip"), bad_documents="skip"))
    assert [src[i] for i in range(len(src))] == ["small one", "small two", "small three"]
    assert 1 not in decoded and src.skipped_rows == 1


def test_a_parquet_value_over_the_record_cap_is_a_bad_document(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    import hlat.data.records as records

    monkeypatch.setattr(records, "MAX_RECORD_BYTES", 64)
    pq.write_table(pa.table({"text": ["short", "z" * 65]}), tmp_path / "docs.parquet")
    with pytest.raises(DataError, match=r"docs.parquet, row 1: longer than 0 MiB \(the record cap\)"):
        open_entry(str(tmp_path / "docs.parquet"), DataConfig(cache_dir=str(tmp_path / "c1")))
    src = open_entry(str(tmp_path / "docs.parquet"), DataConfig(cache_dir=str(tmp_path / "c2"), bad_documents="skip"))
    assert [src[i] for i in range(len(src))] == ["short"]
