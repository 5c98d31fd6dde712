"""Row sources (Arrow file/stream, Parquet, JSONL plain/.gz/.zst, datasets on disk) and bad input."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
import zstandard

from hlat.config.data import DataConfig
from hlat.config.data_paths import entry_kind
from hlat.data import BadDocument, PackedLoader, RowSource, open_entry

DOCS = [f"document {i}: " + "héllo wörld 日本 " * (i % 7) + "\nend\n" for i in range(53)] + [""]


def write_arrow(path, docs, stream=False, batch=10, column="text"):
    schema = pa.schema([(column, pa.string())])
    opener = ipc.new_stream if stream else ipc.new_file
    with opener(str(path), schema) as w:
        for a in range(0, len(docs), batch):
            w.write_batch(pa.record_batch([pa.array(docs[a : a + batch])], schema=schema))


def write_jsonl(path, rows, opener=open):
    with opener(path, "wb") as f:
        for r in rows:
            f.write(
                (json.dumps(r) if not isinstance(r, bytes) else r.decode("latin-1")).encode() + b"\n"
                if not isinstance(r, bytes)
                else r + b"\n"
            )


def zst_open(path, mode):
    return zstandard.ZstdCompressor().stream_writer(open(path, mode))


def cfg(tmp_path, **kw):
    return DataConfig(cache_dir=str(tmp_path / "cache"), **kw)


def all_docs(src):
    return [src[i] for i in range(len(src))]


def test_every_format_reads_the_same_documents(tmp_path):
    rows = [{"text": d, "id": i} for i, d in enumerate(DOCS)]
    write_arrow(tmp_path / "a.arrow", DOCS)
    write_arrow(tmp_path / "s.arrows", DOCS, stream=True)
    pq.write_table(pa.table({"text": DOCS}), tmp_path / "p.parquet", row_group_size=7)
    write_jsonl(tmp_path / "j.jsonl", rows)
    write_jsonl(tmp_path / "j.jsonl.gz", rows, gzip.open)
    write_jsonl(tmp_path / "j.jsonl.zst", rows, zst_open)
    import datasets

    datasets.Dataset.from_dict({"text": DOCS}).save_to_disk(str(tmp_path / "hf"))
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"text": DOCS}), "val": datasets.Dataset.from_dict({"text": DOCS[:3]})}
    ).save_to_disk(str(tmp_path / "hfd"))
    kinds = {
        "a.arrow": "arrow",
        "s.arrows": "arrow",
        "p.parquet": "parquet",
        "j.jsonl": "jsonl",
        "j.jsonl.gz": "jsonl",
        "j.jsonl.zst": "jsonl",
        "hf": "hf_disk",
        "hfd": "hf_disk",
    }
    fps = set()
    for name, kind in kinds.items():
        entry = str(tmp_path / name)
        assert entry_kind(entry) == kind
        src = open_entry(entry, cfg(tmp_path))
        assert isinstance(src, RowSource)
        assert all_docs(src) == DOCS, name
        assert open_entry(entry, cfg(tmp_path)).fingerprint() == src.fingerprint()  # cached, stable
        fps.add(src.fingerprint())
    assert len(fps) == len(kinds) - 1  # the two HF directories hold the same train split data
    val = open_entry(str(tmp_path / "hfd"), cfg(tmp_path, split="val"))
    assert all_docs(val) == DOCS[:3]
    with pytest.raises(ValueError, match="splits train, val, not 'test'"):
        open_entry(str(tmp_path / "hfd"), cfg(tmp_path, split="test"))
    # a directory of data files is one source, files in sorted order
    (tmp_path / "dir").mkdir()
    write_arrow(tmp_path / "dir" / "0.arrow", DOCS[:20])
    write_jsonl(tmp_path / "dir" / "1.jsonl", [{"text": d} for d in DOCS[20:]])
    (tmp_path / "dir" / "README.md").write_text("about")
    src = open_entry(str(tmp_path / "dir"), cfg(tmp_path))
    assert entry_kind(str(tmp_path / "dir")) == "rows" and all_docs(src) == DOCS


def test_text_field_and_missing_column(tmp_path):
    write_arrow(tmp_path / "c.arrow", DOCS, column="content")
    assert all_docs(open_entry(str(tmp_path / "c.arrow"), cfg(tmp_path, text_field="content"))) == DOCS
    with pytest.raises(ValueError, match=r"c\.arrow has no column 'text' \(columns: content\).*data.text_field"):
        open_entry(str(tmp_path / "c.arrow"), cfg(tmp_path))
    pq.write_table(pa.table({"body": DOCS}), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=r"p\.parquet has no column 'text'.*body"):
        open_entry(str(tmp_path / "p.parquet"), cfg(tmp_path))


def test_bad_rows_error_or_counted_skip(tmp_path, tok):
    rows = [
        json.dumps({"text": "good one"}).encode(),
        b'{"text": "caf\xe9 latin-1"}',
        json.dumps({"body": "no text field"}).encode(),
        b'{"text": "truncated',
        json.dumps({"text": 7}).encode(),
        json.dumps({"text": "good two"}).encode(),
    ]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(rows) + b"\n")
    with pytest.raises(BadDocument, match=r"bad\.jsonl, line 2: not UTF-8.*bad_documents=skip"):
        open_entry(str(path), cfg(tmp_path))
    src = open_entry(str(path), cfg(tmp_path, bad_documents="skip"))
    assert all_docs(src) == ["good one", "good two"] and src.skipped_rows == 4
    # Arrow rows are checked when read: a null text and invalid UTF-8 bytes
    binary = pa.array([b"fine", b"\xff\xfe", None], pa.binary())
    with ipc.new_file(str(tmp_path / "b.arrow"), pa.schema([("text", pa.binary())])) as w:
        w.write_batch(pa.record_batch([binary], names=["text"]))
    src = open_entry(str(tmp_path / "b.arrow"), cfg(tmp_path))
    assert src[0] == "fine"
    with pytest.raises(BadDocument, match=r"b\.arrow, row 1: not UTF-8"):
        src[1]
    with pytest.raises(BadDocument, match=r"b\.arrow, row 2: the text field is null"):
        src[2]
    strict = PackedLoader(src, tok, seq_len=8, batch_size=1, seed=0, prefetch=False)
    with pytest.raises(BadDocument, match="b.arrow, row"):
        [strict.next_batch() for _ in range(3)]
    lenient = PackedLoader(
        src, tok, seq_len=8, batch_size=1, seed=0, bad_documents="skip", prefetch=False, log_fn=(logged := []).append
    )
    rows_out = [lenient.next_batch().tokens for _ in range(3)]
    epochs = lenient.epoch + 1  # both bad rows are met (and counted) once per epoch
    assert lenient.bad_skipped in (2 * epochs - 2, 2 * epochs, 2 * epochs - 1)
    assert len(logged) == min(lenient.bad_skipped, 10) and "b.arrow, row" in logged[0]
    assert all(set(r.flatten().tolist()) <= set(tok.encode("fine") + [tok.eos_id]) for r in rows_out)


def test_corrupt_and_truncated_files(tmp_path):
    write_arrow(tmp_path / "a.arrow", DOCS)
    data = (tmp_path / "a.arrow").read_bytes()
    (tmp_path / "t.arrow").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"t\.arrow.*corrupt or truncated"):
        open_entry(str(tmp_path / "t.arrow"), cfg(tmp_path))
    write_arrow(tmp_path / "s.arrows", DOCS, stream=True)
    data = (tmp_path / "s.arrows").read_bytes()
    (tmp_path / "ts.arrows").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"ts\.arrows.*corrupt or truncated"):
        open_entry(str(tmp_path / "ts.arrows"), cfg(tmp_path))
    write_jsonl(tmp_path / "j.jsonl.gz", [{"text": d} for d in DOCS * 50], gzip.open)
    data = (tmp_path / "j.jsonl.gz").read_bytes()
    (tmp_path / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"t\.jsonl\.gz after line \d+: the file is corrupt or truncated"):
        open_entry(str(tmp_path / "t.jsonl.gz"), cfg(tmp_path))
    (tmp_path / "z.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd garbage")
    with pytest.raises(ValueError, match=r"z\.jsonl\.zst.*corrupt"):
        open_entry(str(tmp_path / "z.jsonl.zst"), cfg(tmp_path))
    (tmp_path / "p.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match=r"p\.parquet as Parquet: it is corrupt"):
        open_entry(str(tmp_path / "p.parquet"), cfg(tmp_path))


def test_huge_single_document_is_split_not_hung(tmp_path, tok):
    """A 600 kB document on one JSONL line: split at max_doc_chars, one EOS (memory: see
    test_hundred_megabyte_document)."""
    text = ("a line of text that repeats\n" * 22_000)[:600_000]
    write_jsonl(tmp_path / "big.jsonl", [{"text": "small"}, {"text": text}])
    src = open_entry(str(tmp_path / "big.jsonl"), cfg(tmp_path))
    loader = PackedLoader(src, tok, seq_len=64, batch_size=2, seed=0, max_doc_chars=50_000, prefetch=False)
    toks = loader.document_tokens(1)
    assert int((toks == tok.eos_id).sum()) == 1 and len(toks) > 100_000
    assert loader.next_batch().tokens.shape == (2, 64)


def test_hundred_megabyte_document(tmp_path, tok):
    """A single document streams through reading, splitting, tokenization and packing in bounded
    memory: in a fresh process, a full pass over an 8 MB document (2.5M tokens, every one checked)
    and the first batches of a 100 MB document each raise the peak resident set by under 100 MB
    (the whole-document path needed ~5 GB for the 8 MB one)."""
    line = "the of and to in is that for it as with was on be by at this from\n"
    for name, mb in (("full.txt", 8), ("huge.txt", 100)):
        with open(tmp_path / name, "w") as f:
            f.write(line * (mb * 1_000_000 // len(line)))
    tok.save(tmp_path / "tok.json")
    code = f"""
import resource
import numpy as np
from hlat.data import PackedLoader, TextFiles, load_tokenizer
tok = load_tokenizer({str(tmp_path / "tok.json")!r})
def peak(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
line = np.array(tok.encode({line!r}), dtype=np.int64)
base = peak()
total = {8_000_000 // len(line)} * len(line) + 1
loader = PackedLoader(TextFiles({str(tmp_path / "full.txt")!r}), tok, seq_len=4096, batch_size=16, seed=0)
seen = 0
while seen < total:  # the document's tokens: the line's, repeated, then one EOS
    toks = loader.next_batch().tokens.flatten().numpy()[: total - seen]
    p = np.arange(seen, seen + len(toks))
    assert (toks == np.where(p == total - 1, tok.eos_id, line[p % len(line)])).all(), seen
    seen += len(toks)
loader.close()
full = peak() - base
loader = PackedLoader(TextFiles({str(tmp_path / "huge.txt")!r}), tok, seq_len=4096, batch_size=16, seed=0)
assert all(loader.next_batch().tokens.shape == (16, 4096) for _ in range(4))
print(total, full, peak() - base)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    tokens, full_mb, huge_mb = map(int, out)
    assert tokens > 2_000_000
    assert full_mb < 100, f"a full pass over an 8 MB document grew the resident set by {full_mb} MB"
    assert huge_mb < 100, f"the first batches of a 100 MB document grew the resident set by {huge_mb} MB"


def test_arrow_corpus_larger_than_the_memory_allowed(tmp_path):
    """Reading every document of a 400 MB Arrow file grows the resident set by far less than the
    file: it is mapped (pages are the OS's to evict), never loaded."""
    path = tmp_path / "big.arrow"
    doc = "z" * 1_000_000
    schema = pa.schema([("text", pa.large_string())])
    with ipc.new_file(str(path), schema) as w:
        for _ in range(40):
            w.write_batch(pa.record_batch([pa.array([doc] * 10, pa.large_string())], schema=schema))
    code = f"""
import resource, sys
from hlat.config.data import DataConfig
from hlat.data import open_entry
src = open_entry({str(path)!r}, DataConfig())
peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
total = sum(len(src[i]) for i in range(len(src)))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(total, (peak - peak0) // 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert int(out[0]) == 400_000_000
    # resident memory grows by at most ~a few documents plus the OS page cache mapping accounting
    assert path.stat().st_size > 400e6
    assert int(out[1]) < 100, f"resident memory grew by {out[1]} MB while reading a 400 MB file"
