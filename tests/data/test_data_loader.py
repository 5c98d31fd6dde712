"""Document masking, token shards, mixtures, resharding and validation through build_loader."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal

import pytest
import torch

from hlat.config.data import DataConfig
from hlat.config.model import ModelConfig
from hlat.data import (
    IGNORE_INDEX,
    OnlineDocuments,
    PackedLoader,
    ShardDocuments,
    TextFiles,
    Validation,
    build_data_tokenizer,
    build_loader,
    check_shard_sources,
    make_batch,
    merge_states,
    prepare_shards,
)
from hlat.model import Llama

SEQ, BATCH = 32, 2


def test_document_masking_isolates_documents(tok):
    """With document masking, changing one document's tokens leaves every logit of the next
    document unchanged; without it, they change."""
    torch.manual_seed(0)
    model = Llama(
        ModelConfig(
            vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=SEQ
        )
    )
    eos = tok.eos_id
    a, b = [5, 6, 7, 8, 9, eos], [10, 11, 12, 13, eos]
    row = torch.tensor([a + b + list(range(20, 20 + SEQ - len(a) - len(b)))])
    other = row.clone()
    other[0, :5] = torch.tensor([30, 31, 32, 33, 34])  # a different first document
    span = slice(len(a), len(a) + len(b))
    for masking in (True, False):
        x, y = (make_batch(t, eos, masking, True) for t in (row, other))
        # the training path: train mode, autograd recording, the mask the trainer passes
        lx = model(x.tokens, positions=x.positions, attn_mask=x.attn_mask)
        ly = model(y.tokens, positions=y.positions, attn_mask=y.attn_mask)
        same = torch.allclose(lx[0, span], ly[0, span], atol=1e-6)
        assert same == masking
    x = make_batch(row, eos, True, True)
    assert x.positions[0, :13].tolist() == list(range(6)) + list(range(5)) + [0, 1]
    assert x.doc_ids[0, :12].tolist() == [0] * 6 + [1] * 5 + [2]
    assert x.labels[0, 5] == IGNORE_INDEX and x.labels[0, 4] == eos  # EOS -> next doc not trained
    assert make_batch(row, eos, True, False).labels[0, 5] == 10
    assert x.attn_mask.shape == (1, 1, SEQ, SEQ) and not x.attn_mask[0, 0, 6, 5] and x.attn_mask[0, 0, 7, 6]
    assert make_batch(row, eos, False, True).positions is None


def test_shards_equal_online_packing_and_resume_across(tmp_path, source, tok):
    online_docs = OnlineDocuments(source, tok, max_doc_chars=500)
    seen = []
    manifest = prepare_shards(online_docs, tmp_path / "shards", docs_per_shard=10, progress=lambda d, t: seen.append(d))
    assert manifest["complete"] and len(manifest["shards"]) == 5 and sum(seen) == len(source)
    assert (
        manifest["dtype"] == "uint16"
        and check_shard_sources([str(tmp_path / "shards")], tok.vocab_size, True, tmp_path / "cache") is None
    )
    shards = ShardDocuments(tmp_path / "shards", tok)
    online = PackedLoader(online_docs, tok, seq_len=SEQ, batch_size=BATCH, seed=4)
    offline = PackedLoader(shards, tok, seq_len=SEQ, batch_size=BATCH, seed=4)
    n = 3 * sum(len(online_docs.tokens([i])[0]) for i in range(len(source))) // (SEQ * BATCH)
    again = None
    for k in range(n):  # three epochs
        x = online.next_batch().tokens
        assert torch.equal(x, offline.next_batch().tokens), k
        if again is not None:
            assert torch.equal(x, again.next_batch().tokens), k
        if k == n // 2:  # an online state resumes on the shards
            state = online.state_dict()
            assert state == offline.state_dict()
            again = PackedLoader(shards, tok, seq_len=SEQ, batch_size=BATCH, seed=4)
            again.load_state_dict(state)
    # an interrupted prepare resumes; other tokenizers and damaged shards are refused
    m = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    m["shards"], m["complete"] = m["shards"][:2], False
    (tmp_path / "shards" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match="incomplete.*run the same `hlat prepare`"):
        ShardDocuments(tmp_path / "shards", tok)
    resumed = []
    prepare_shards(online_docs, tmp_path / "shards", docs_per_shard=10, progress=lambda d, t: resumed.append(d))
    assert resumed[0] == 20 and sum(resumed) == len(source)
    assert check_shard_sources([str(tmp_path / "shards")], tok.vocab_size, True, tmp_path / "cache") is None
    from hlat.data import train_bpe

    other = train_bpe(source, vocab_size=300, max_chars=50_000)
    with pytest.raises(ValueError, match="tokenizer.*differ.*refusing to mix"):
        prepare_shards(OnlineDocuments(source, other, max_doc_chars=500), tmp_path / "shards", docs_per_shard=10)
    with pytest.raises(ValueError, match="made with another tokenizer"):
        ShardDocuments(tmp_path / "shards", other)
    big = type("Big", (), {"vocab_size": 70_000, "fingerprint": lambda self: "x"})()
    with pytest.raises(ValueError, match="uint16 tokens but the tokenizer has 70000 ids"):
        ShardDocuments(tmp_path / "shards", big)
    (tmp_path / "shards" / "tokens-00001.bin").write_bytes(b"\0\0")
    with pytest.raises(ValueError, match="tokens-00001.bin is missing or has the wrong size"):
        ShardDocuments(tmp_path / "shards", tok)


def _mixture(tmp_path, corpus_factory):
    for name, n, seed in (("a", 30, 1), ("b", 12, 2), ("c", 50, 3)):
        corpus_factory(tmp_path / name, n_docs=n, seed=seed, long_chars=300)
    return [TextFiles(tmp_path / n) for n in "abc"]


def test_mixture_proportions_and_exact_resume(tmp_path, corpus_factory, tok):
    sources = _mixture(tmp_path, corpus_factory)
    weights = [0.6, 0.3, 0.1]
    loader = PackedLoader(sources, tok, seq_len=64, batch_size=4, seed=9, weights=weights)
    batches, states = [], []
    for _ in range(400):
        states.append(loader.state_dict())
        batches.append(loader.next_batch().tokens)
    total = sum(loader.tokens_emitted)
    assert total == 400 * 4 * 64
    for share, w in zip(loader.token_shares().values(), weights):
        assert abs(share - w) < 0.01
    assert loader.streams[1].epoch >= 3  # the small source was repeated over several epochs
    for k in (0, 57, 233):
        resumed = PackedLoader(sources, tok, seq_len=64, batch_size=4, seed=9, weights=weights)
        resumed.load_state_dict(states[k])
        for j in range(k, k + 20):
            assert torch.equal(resumed.next_batch().tokens, batches[j]), (k, j)
    with pytest.raises(ValueError, match="different mixture weights"):
        PackedLoader(sources, tok, seq_len=64, batch_size=4, seed=9, weights=[1, 1, 1]).load_state_dict(states[5])


@pytest.mark.parametrize("before,after", [(4, 2), (2, 4)])
def test_resharding_continues_without_skips_or_repeats(source, tok, before, after):
    """Run `before` ranks part of the way into epoch 0, merge their states, continue on `after`
    ranks to the end of epoch 0: every document of the epoch is read exactly once."""

    def run(loaders, steps):
        for _ in range(steps):
            for ld in loaders:
                ld.next_batch()

    old = [
        PackedLoader(
            source, tok, seq_len=8, batch_size=1, seed=3, dp_rank=r, dp_size=before, prefetch=False, virtual_shards=8
        )
        for r in range(before)
    ]
    run(old, 15)
    started = {v: p for ld in old for v, p in ld.streams[0].state_dict().items()}
    merged = merge_states([ld.state_dict() for ld in old])
    new = [
        PackedLoader(
            source, tok, seq_len=8, batch_size=1, seed=3, dp_rank=r, dp_size=after, prefetch=False, virtual_shards=8
        )
        for r in range(after)
    ]
    for ld in new:
        ld.load_state_dict(merged)
    assert {v: p for ld in new for v, p in ld.streams[0].state_dict().items()} == started
    perm = old[0].streams[0]._perms(0)
    V = old[0].virtual_shards
    finished, partial = [], []
    for ld in old:
        for v, (e, c, off) in ld.streams[0].state_dict().items():
            n_v = ld.streams[0].lengths[int(v)]
            assert e <= 1 and (e == 0 or c < n_v)
            finished += [int(perm[int(v) + i * V]) for i in range(c if e == 0 else n_v)]
            partial += [int(perm[int(v) + c * V])] if off > 0 and e == 0 else []
    assert partial  # some documents were cut mid-way by the stop
    continued = []
    for ld in new:
        stream = ld.streams[0]
        while stream.epoch == 0:
            (e, c, v), (_, off) = stream._heap[0], stream.head()
            doc = int(perm[v + c * V])
            assert (off > 0) == (doc in partial)  # a cut document resumes at its offset
            continued.append(doc)
            stream.advance()
    assert len(set(continued)) == len(continued) and not set(continued) & set(finished)
    assert sorted(finished + continued) == list(range(len(source)))
    with pytest.raises(ValueError, match="merge_states"):
        PackedLoader(
            source, tok, seq_len=8, batch_size=1, seed=3, dp_rank=0, dp_size=after, virtual_shards=8
        ).load_state_dict(old[0].state_dict())
    with pytest.raises(ValueError, match="states of all"):
        merge_states([ld.state_dict() for ld in old[:-1]])


def test_build_loader_validation_and_tokenizer(tmp_path, corpus_factory, tok):
    sources = _mixture(tmp_path, corpus_factory)
    (tmp_path / "tok.json").parent.mkdir(exist_ok=True)
    tok.save(tmp_path / "tok.json")
    cfg = DataConfig(
        source=",".join(str(tmp_path / n) for n in "ab"),
        weights="3,1",
        seq_len=SEQ,
        tokenizer=str(tmp_path / "tok.json"),
        val_source="holdout",
        val_fraction=0.1,
        document_masking=True,
    )
    tk, line = build_data_tokenizer(cfg, 512)
    assert "tok.json" in line
    logs = []
    loader = build_loader(cfg, tk, seed=1, batch_size=BATCH, log_fn=logs.append)
    assert "x3" in logs[0] and loader.weights == [3.0, 1.0]
    b = loader.next_batch()
    assert b.positions is not None and b.attn_mask is not None
    val = Validation(cfg, tk, batch_size=BATCH, num_batches=2)
    assert len(val.docs) >= 1 and len(val.docs) + len(loader.docs[0]) == len(sources[0])
    first, second = val.batches(), val.batches()
    assert all(torch.equal(x.tokens, y.tokens) for x, y in zip(first, second))
    with pytest.raises(ValueError, match="no validation data"):
        Validation(
            DataConfig(seq_len=SEQ, tokenizer=cfg.tokenizer, source=str(tmp_path / "a")),
            tk,
            batch_size=1,
            num_batches=1,
        )
    # token shards as data.source: the tokenizer comes from the shard directory
    prepare_shards(OnlineDocuments(sources[2], tk, 100_000), tmp_path / "sh", docs_per_shard=16)
    shard_cfg = DataConfig(source=str(tmp_path / "sh"), seq_len=SEQ)
    tk2, line = build_data_tokenizer(shard_cfg, 512)
    assert "sh/tokenizer.json" in line and tk2.fingerprint() == tk.fingerprint()
    online_cfg = DataConfig(source=str(tmp_path / "c"), seq_len=SEQ, tokenizer=str(tmp_path / "tok.json"))
    x = build_loader(shard_cfg, tk2, seed=2, batch_size=BATCH).next_batch().tokens
    y = build_loader(online_cfg, tk, seed=2, batch_size=BATCH).next_batch().tokens
    assert torch.equal(x, y)


def test_prepare_killed_mid_shard_resumes_to_the_same_shards(tmp_path, source, tok):
    """A prepare killed (SIGKILL, in a forked process) while writing shard 2 leaves shards 0-1 in
    the manifest and shard 2 only as a temporary file: readers refuse the directory as incomplete;
    the rerun rewrites shard 2 on, removes the leftover and ends byte-identical to an
    uninterrupted prepare."""
    docs = OnlineDocuments(source, tok, max_doc_chars=500)
    clean = prepare_shards(docs, tmp_path / "clean", docs_per_shard=10, batch_docs=5)
    killed = OnlineDocuments(source, tok, max_doc_chars=500)
    calls, real = [0], killed.tokens

    def dies_in_shard_2(indices):
        calls[0] += 1
        if calls[0] == 6:  # the second batch of shard 2: its first half is already on disk
            os.kill(os.getpid(), signal.SIGKILL)
        return real(indices)

    killed.tokens = dies_in_shard_2
    out = tmp_path / "shards"
    child = multiprocessing.get_context("fork").Process(
        target=prepare_shards, args=(killed, out), kwargs={"docs_per_shard": 10, "batch_docs": 5}
    )
    child.start()
    child.join(timeout=300)
    assert child.exitcode == -signal.SIGKILL
    assert len(json.loads((out / "manifest.json").read_text())["shards"]) == 2
    leftovers = list(out.glob(".tokens-00002.bin.*"))
    assert len(leftovers) == 1 and not (out / "tokens-00002.bin").exists()
    with pytest.raises(ValueError, match="incomplete"):
        ShardDocuments(out, tok)
    assert prepare_shards(docs, out, docs_per_shard=10, batch_docs=5)["shards"] == clean["shards"]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "clean").iterdir())
    for name in (s[k] for s in clean["shards"] for k in ("tokens", "offsets")):
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name
    assert check_shard_sources([str(out)], tok.vocab_size, True, tmp_path / "cache") is None and len(
        ShardDocuments(out, tok)
    ) == len(source)
