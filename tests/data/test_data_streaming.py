"""Long documents stream: the same tokens and batches as when held whole, read and tokenized a
window at a time (online and from shards), refused or skipped as a whole when unreadable."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import hlat.data.documents as documents
import hlat.data.shards as shards
from hlat.config.data import DataConfig
from hlat.data import (
    BadDocument,
    OnlineDocuments,
    PackedLoader,
    ShardDocuments,
    TextFiles,
    open_entry,
    prepare_shards,
    split_document,
)
from hlat.data.documents import TokenPieces, split_pieces

SEQ, BATCH, N = 32, 4, 40


def batches(loader, n):
    return [loader.next_batch().tokens for _ in range(n)]


@pytest.fixture
def small_windows(monkeypatch):
    """Every document over 64 bytes streams (windows cut inside multi-byte characters); shard
    documents over 50 tokens are read in pieces of 50."""
    monkeypatch.setattr(documents, "STREAM_CHARS", 64)
    monkeypatch.setattr(shards, "STREAM_TOKENS", 50)


def test_split_pieces_over_any_windows_equals_split_document():
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice("ab\n é") for _ in range(rng.randint(0, 80)))
        max_chars = rng.randint(1, 12)
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
        windows = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert list(split_pieces(windows, max_chars)) == split_document(text, max_chars), (text, max_chars, windows)


def test_streamed_documents_pack_and_resume_identically(tmp_path, source, tok, monkeypatch):
    arrow = tmp_path / "docs.arrow"
    with ipc.new_file(str(arrow), pa.schema([("text", pa.large_string())])) as w:
        w.write_batch(
            pa.record_batch([pa.array([source[i] for i in range(len(source))], pa.large_string())], names=["text"])
        )
    rows = open_entry(str(arrow), DataConfig(cache_dir=str(tmp_path / "c")))
    held = batches(PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=5, max_doc_chars=40), N)
    monkeypatch.setattr(documents, "STREAM_CHARS", 64)
    docs = OnlineDocuments(source, tok, max_doc_chars=40)
    long = [i for i in range(len(source)) if isinstance(docs.tokens([i])[0], TokenPieces)]
    assert len(long) > len(source) // 2  # most documents take the streaming path
    for src in (rows, source):
        for prefetch in (True, False):
            loader = PackedLoader(src, tok, seq_len=SEQ, batch_size=BATCH, seed=5, max_doc_chars=40, prefetch=prefetch)
            states = []  # the text files' states are the ones resumed below
            for k in range(N):
                states.append(loader.state_dict())
                assert np.array_equal(loader.next_batch().tokens, held[k]), (src, prefetch, k)
            loader.close()
    for k in range(0, N, 7):  # resume inside streamed documents
        resumed = PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=5, max_doc_chars=40, prefetch=False)
        resumed.load_state_dict(states[k])
        assert all(np.array_equal(b, held[k + j]) for j, b in enumerate(batches(resumed, 3)))


def test_shards_of_long_documents_stream(tmp_path, source, tok, small_windows):
    online = OnlineDocuments(source, tok, max_doc_chars=40)
    prepare_shards(online, tmp_path / "sh", docs_per_shard=16)
    from_shards = ShardDocuments(tmp_path / "sh", tok)
    assert any(isinstance(t, TokenPieces) for t in from_shards.tokens(list(range(len(source)))))
    for i in range(len(source)):
        a, b = (
            PackedLoader(d, tok, seq_len=SEQ, batch_size=1, seed=0, prefetch=False).document_tokens(i)
            for d in (online, from_shards)
        )
        assert np.array_equal(a, b)
    a, b = (batches(PackedLoader(d, tok, seq_len=SEQ, batch_size=BATCH, seed=2), 10) for d in (online, from_shards))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_long_bad_or_blank_document_is_one_unit(tmp_path, tok, small_windows):
    """A bad byte at the end of a streamed document refuses it before any of its tokens is emitted
    (or skips it whole); a long whitespace-only document is skipped as blank."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a_bad.txt").write_bytes(("good text\n" * 30).encode() + b"\xff")
    (tmp_path / "d" / "b_blank.txt").write_text(" \n\t" * 100)
    (tmp_path / "d" / "c_ok.txt").write_text("fine\n" * 20)
    src = TextFiles(tmp_path / "d")
    (bad,) = OnlineDocuments(src, tok).tokens([0])
    assert isinstance(bad, BadDocument) and "a_bad.txt (document 0): not UTF-8 (invalid start byte at byte 300)" in str(
        bad
    )
    loader = PackedLoader(
        src, tok, seq_len=SEQ, batch_size=BATCH, seed=0, bad_documents="skip", prefetch=False, log_fn=lambda m: None
    )
    stream = np.concatenate([b.flatten() for b in batches(loader, 4)])
    ok = np.array(tok.encode("fine\n" * 20) + [tok.eos_id])
    assert np.array_equal(stream, np.tile(ok, -(-len(stream) // len(ok)))[: len(stream)])
    assert loader.bad_skipped >= 1 and loader.empty_skipped >= 1
    binary = pa.array([b"ok " * 40 + b"\xfe", b"x"], pa.binary())
    with ipc.new_file(str(tmp_path / "b.arrow"), pa.schema([("text", pa.binary())])) as w:
        w.write_batch(pa.record_batch([binary], names=["text"]))
    rows = open_entry(str(tmp_path / "b.arrow"), DataConfig(cache_dir=str(tmp_path / "c")))
    (bad,) = OnlineDocuments(rows, tok).tokens([0])
    assert isinstance(bad, BadDocument) and "b.arrow, row 0: not UTF-8 (invalid start byte at byte 120)" in str(bad)
