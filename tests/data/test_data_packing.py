"""PackedLoader: HLAT's online packing against a straightforward reference, and exact resume."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from hlat.data import IGNORE_INDEX, PackedLoader, TextFiles, epoch_permutation, split_document

SEQ, BATCH = 32, 4


def reference_docs(source, tok, seed, epochs, dp_rank=0, dp_size=1):
    """(epoch, cursor, tokens) of each document in stream order, the obvious way."""
    out = []
    for e in range(epochs):
        order = epoch_permutation(len(source), seed, e)[dp_rank::dp_size].tolist()
        for c, i in enumerate(order):
            text = source[i]
            toks = tok.encode(text) + [tok.eos_id] if text.strip() else []
            out.append((e, c, toks))
    return out


def reference_stream(source, tok, seed, epochs, dp_rank=0, dp_size=1):
    docs = reference_docs(source, tok, seed, epochs, dp_rank, dp_size)
    return [t for _, _, toks in docs for t in toks]


def tokens_per_epoch(source, tok):
    return len(reference_stream(source, tok, 0, 1))


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("dp_rank,dp_size", [(0, 1), (0, 2), (1, 2)])
def test_packing_matches_reference(source, tok, dp_rank, dp_size):
    per_epoch = tokens_per_epoch(source, tok) / dp_size
    n_batches = int(2.5 * per_epoch / (SEQ * BATCH)) + 1  # runs well into the third epoch
    loader = PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=7, dp_rank=dp_rank, dp_size=dp_size)
    ref = reference_stream(source, tok, 7, 4, dp_rank, dp_size)
    got = []
    for _ in range(n_batches):
        b = loader.next_batch()
        assert b.tokens.shape == (BATCH, SEQ) and b.tokens.dtype == torch.int64
        assert b.labels.shape == (BATCH, SEQ) and b.labels.dtype == torch.int64
        assert torch.equal(b.labels[:, :-1], b.tokens[:, 1:])
        assert (b.labels[:, -1] == IGNORE_INDEX).all()
        got.extend(b.tokens.flatten().tolist())
    assert loader.epoch >= 2
    assert got == ref[: len(got)]


def test_stream_structure(source, tok):
    """No BOS anywhere, exactly one EOS per non-empty document, empty documents skipped."""
    loader = PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=1)
    docs = reference_docs(source, tok, 1, 1)
    total = sum(len(t) for _, _, t in docs)
    n_batches = -(-total // (SEQ * BATCH))
    stream = torch.cat([loader.next_batch().tokens.flatten() for _ in range(n_batches)])[:total]
    non_empty = sum(1 for d in source if d.strip())
    assert non_empty == len(source) - 2
    assert int((stream == tok.eos_id).sum()) == non_empty
    # a document's tokens are immediately followed by EOS, and the next one starts right after
    pos = 0
    for _, _, toks in docs:
        if toks:
            assert stream[pos + len(toks) - 1] == tok.eos_id
            pos += len(toks)
    assert loader.documents_skipped == 2
    assert tok.tk.token_to_id("<s>") is None  # there is no BOS to add


def head_of(state, source=0):
    """(epoch, cursor in the reference order, offset) of the document being read. With one rank
    and more virtual shards than documents, shard v holds exactly document perm[v] of each epoch."""
    shards = state["shards"][source]
    e, c, v = min((p[0], p[1], int(v)) for v, p in shards.items())
    assert c == 0
    return e, v, shards[str(v)][2]


def test_position_is_what_was_returned(source, tok):
    """The state after k batches names the exact next token of the reference stream, however far
    the loader tokenized ahead."""
    docs = reference_docs(source, tok, 3, 4)
    starts, pos = {}, 0
    for e, c, toks in docs:
        starts[(e, c)] = (pos, len(toks))
        pos += len(toks)
    loader = PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=3)
    for k in range(1, 120):
        loader.next_batch()
        s = loader.state_dict()
        epoch, cursor, offset = head_of(s)
        start, n = starts[(epoch, cursor)]
        assert 0 <= offset < max(n, 1)
        assert start + offset == k * SEQ * BATCH, (k, s)
        assert loader.documents_seen == epoch * len(source) + cursor
        assert s["tokens_emitted"] == [k * SEQ * BATCH]


def test_exact_resume_everywhere(source, tok):
    """Stopping after any batch, saving (torch.save/load weights_only) and resuming in a new
    loader gives the uninterrupted stream: inside the long document and across epochs."""
    per_epoch = tokens_per_epoch(source, tok)
    n = int(2.2 * per_epoch / (SEQ * BATCH)) + 1
    ahead = 3
    base = PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=11)
    batches, states = [], [roundtrip(base.state_dict())]
    for _ in range(n + ahead):
        batches.append(base.next_batch())
        states.append(roundtrip(base.state_dict()))
    long_len = len(tok.encode(source[len(source) - 1])) + 1  # sub/long.md sorts last
    assert long_len > 3 * SEQ * BATCH
    long_index = len(source) - 1
    inside_long = across_epoch = 0
    for k in range(n):
        s = states[k]
        epoch, cursor, offset = head_of(s)
        order = base.documents_for_epoch(epoch)
        inside_long += offset > 0 and order[cursor] == long_index
        resumed = PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=11)
        resumed.load_state_dict(s)
        for j in range(ahead):
            b = resumed.next_batch()
            across_epoch += epoch != head_of(states[k + j + 1])[0]
            assert torch.equal(b.tokens, batches[k + j].tokens), (k, j)
            assert torch.equal(b.labels, batches[k + j].labels)
        assert resumed.state_dict() == states[k + ahead]
    assert inside_long >= 2 and across_epoch >= 2


def test_resume_refuses_other_layouts(source, tok, tmp_path, corpus_factory):
    loader = PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=0)
    loader.next_batch()
    state = loader.state_dict()
    with pytest.raises(ValueError, match="different seq_len"):
        PackedLoader(source, tok, seq_len=SEQ * 2, batch_size=BATCH, seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="rank 0 of 1.*merge_states"):
        PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=0, dp_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="different seed"):
        PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="virtual_shards"):
        PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=0, virtual_shards=64).load_state_dict(state)
    corpus_factory(tmp_path / "other", n_docs=5)
    other = TextFiles(tmp_path / "other")
    with pytest.raises(ValueError, match="different data"):
        PackedLoader(other, tok, seq_len=SEQ, batch_size=BATCH, seed=0).load_state_dict(state)
    # a different batch size is fine: the position is in tokens, not batches
    resumed = PackedLoader(source, tok, seq_len=SEQ, batch_size=2 * BATCH, seed=0)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.next_batch().tokens[:BATCH], loader.next_batch().tokens)


def test_epochs_reshuffle_and_seeds(source, tok):
    loader = PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=5)
    e0, e1 = loader.documents_for_epoch(0), loader.documents_for_epoch(1)
    assert sorted(e0) == sorted(e1) == list(range(len(source)))
    assert e0 != e1
    a = [PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=5).next_batch().tokens for _ in range(1)]
    b = [PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=5).next_batch().tokens for _ in range(1)]
    c = [PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=6).next_batch().tokens for _ in range(1)]
    assert torch.equal(a[0], b[0])
    assert not torch.equal(a[0], c[0])
    assert PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=6).documents_for_epoch(0) != e0


def test_dp_ranks_partition_each_epoch(source, tok):
    r0 = PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=2, dp_rank=0, dp_size=2)
    r1 = PackedLoader(source, tok, seq_len=SEQ, batch_size=BATCH, seed=2, dp_rank=1, dp_size=2)
    for epoch in range(3):
        d0, d1 = set(r0.documents_for_epoch(epoch)), set(r1.documents_for_epoch(epoch))
        assert not d0 & d1
        assert d0 | d1 == set(range(len(source)))
    assert r0.docs_per_epoch + r1.docs_per_epoch == len(source)
    assert not torch.equal(r0.next_batch().tokens, r1.next_batch().tokens)


def test_long_document_split(tmp_path, tok):
    lines = [f"line {i} of a long document with café and 日本\n" for i in range(200)]
    text = "".join(lines) + "x" * 500  # the last stretch has no newline: split hard
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "long.txt").write_text(text, encoding="utf-8")
    (tmp_path / "d" / "short.txt").write_text("short one\n", encoding="utf-8")
    src = TextFiles(tmp_path / "d")
    max_chars = 300
    pieces = split_document(text, max_chars)
    assert "".join(pieces) == text and len(pieces) > 10
    assert all(len(p) <= max_chars for p in pieces)
    assert all(p.endswith("\n") for p in pieces[:-3])
    loader = PackedLoader(src, tok, seq_len=SEQ, batch_size=1, seed=0, max_doc_chars=max_chars)
    got = loader.document_tokens(0).tolist()
    expected = [t for p in pieces for t in tok.encode(p)] + [tok.eos_id]
    assert got == expected
    assert got.count(tok.eos_id) == 1
    # and the packed stream carries exactly those tokens
    order = loader.documents_for_epoch(0)
    stream_ref = [t for i in order for t in loader.document_tokens(i).tolist()]
    n = -(-len(stream_ref) // SEQ)
    stream = torch.cat([loader.next_batch().tokens.flatten() for _ in range(n)]).tolist()
    assert stream[: len(stream_ref)] == stream_ref


def test_split_document_edges():
    assert split_document("abc", 3) == ["abc"]
    assert split_document("abcdef", 4) == ["abcd", "ef"]
    assert split_document("ab\ncdef\ngh", 5) == ["ab\n", "cdef\n", "gh"]
    assert split_document("\n" * 10, 3) == ["\n\n\n"] * 3 + ["\n"]


def test_bad_shards(tmp_path, tok):
    (tmp_path / "one.txt").write_text("only one document\n")
    src = TextFiles(tmp_path / "one.txt")
    with pytest.raises(ValueError, match="fewer than dp_size=2"):
        PackedLoader(src, tok, seq_len=SEQ, batch_size=BATCH, seed=0, dp_rank=1, dp_size=2)
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.txt").write_text("  \n")
    (tmp_path / "blank" / "b.txt").write_text("")
    with pytest.raises(ValueError, match="empty"):
        PackedLoader(TextFiles(tmp_path / "blank"), tok, seq_len=SEQ, batch_size=BATCH, seed=0).next_batch()


def test_single_file_source_loops(tmp_path, tok):
    text = "a single small document, repeated every epoch\n"
    (tmp_path / "one.txt").write_text(text)
    loader = PackedLoader(TextFiles(tmp_path / "one.txt"), tok, seq_len=SEQ, batch_size=BATCH, seed=0)
    doc = tok.encode(text) + [tok.eos_id]
    stream = loader.next_batch().tokens.flatten().tolist()
    reps = -(-len(stream) // len(doc))
    assert stream == (doc * reps)[: len(stream)]
    assert loader.epoch == len(stream) // len(doc)
    assert np.array_equal(loader.document_tokens(0), np.array(doc))
