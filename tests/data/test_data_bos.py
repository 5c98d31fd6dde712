"""data.bos with a Llama-3-style tokenizer.json (built locally): BOS/EOS detection, packing as
BOS + tokens + EOS online, from shards and in mixtures, document masking, exact resume, the
refusals, and a one-step `hlat train`."""

from __future__ import annotations

import pytest
import tokenizers
import torch

import hlat.data.documents as documents
from hlat.cli import USER_ERROR_EXIT, main
from hlat.config.data import DataConfig
from hlat.config.load import load_config, preset_names
from hlat.data import (
    IGNORE_INDEX,
    OnlineDocuments,
    PackedLoader,
    ShardDocuments,
    TextFiles,
    Tokenizer,
    Validation,
    build_data_tokenizer,
    build_loader,
    build_tokenizer,
    make_batch,
    prepare_shards,
)
from hlat.data.tokenizer import BOS_CANDIDATES
from hlat.errors import ConfigError
from llama3_tokenizer import BOS, EOS, EOT, SPECIALS, write_llama3_tokenizer
from runs import tiny_args
from test_data_packing import BATCH, SEQ, head_of, reference_docs, roundtrip


@pytest.fixture(scope="module")
def llama3_file(tmp_path_factory):
    return write_llama3_tokenizer(tmp_path_factory.mktemp("llama3") / "tokenizer.json")


@pytest.fixture(scope="module")
def l3(llama3_file):
    return Tokenizer.from_file(llama3_file)


def bos_stream(source, tok, seed, epochs):
    """The reference stream with data.bos: BOS + tokens + EOS for every non-blank document."""
    return [t for _, _, toks in reference_docs(source, tok, seed, epochs) if toks for t in [tok.bos_id, *toks]]


def stream_of(loader, n):
    return torch.cat([loader.next_batch().tokens.flatten() for _ in range(n)]).tolist()


def test_llama3_special_tokens(l3, llama3_file, tmp_path):
    assert (l3.bos_token, l3.eos_token) == (BOS, EOS)  # <|eot_id|> ends a chat turn, not a document
    assert l3.eos_id == l3.token_id(EOS) != l3.token_id(EOT) and l3.bos_id == l3.token_id(BOS)
    assert l3.vocab_size == max(l3.token_id(t) for t in SPECIALS) + 1
    # the file's post-processor adds BOS; hlat's encoding never does
    assert l3.tk.encode("fox", add_special_tokens=True).ids[0] == l3.bos_id
    text = f"The fox {BOS} jumps{EOS}{EOT} <|reserved_special_token_2|>\n"
    ids = l3.encode(text)
    assert ids == l3.encode_batch([text])[0] and ids[0] != l3.bos_id
    assert not set(ids) & {l3.token_id(t) for t in SPECIALS}  # special-token text stays text
    assert l3.decode(ids) == text
    assert l3.decode([l3.bos_id, *l3.encode("fox"), l3.eos_id]) == f"{BOS}fox{EOS}"
    line = build_tokenizer(DataConfig(tokenizer=str(llama3_file)), 512, None)[1]
    assert f"EOS {EOS!r} = {l3.eos_id}, BOS {BOS!r} = {l3.bos_id}" in line
    # special tokens win over ordinary tokens spelled like earlier candidates
    tk = tokenizers.Tokenizer.from_file(str(llama3_file))
    tk.add_tokens(["<s>", "</s>"])
    tk.save(str(tmp_path / "more.json"))
    more = Tokenizer.from_file(tmp_path / "more.json")
    assert (more.bos_token, more.eos_token) == (BOS, EOS)


def test_bos_detection_elsewhere(tok, tmp_path):
    assert tok.bos_id is None and tok.bos_token is None  # hlat's trained BPE has only its EOS
    vocab = {"[UNK]": 0, "hello": 1, "<s>": 2, "</s>": 3}  # LLaMA-2's names, not marked special
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tk.save(str(tmp_path / "wl.json"))
    wl = Tokenizer.from_file(tmp_path / "wl.json")
    assert (wl.bos_token, wl.bos_id, wl.eos_token) == ("<s>", 2, "</s>")


def test_packing_with_bos(source, l3):
    """Rows are exactly BOS a.. EOS BOS b.. EOS ..., into the second epoch; without data.bos the
    same documents pack as before (no BOS)."""
    ref = bos_stream(source, l3, 7, 2)
    n = int(1.2 * len(bos_stream(source, l3, 7, 1)) / (SEQ * BATCH))
    got = stream_of(PackedLoader(source, l3, seq_len=SEQ, batch_size=BATCH, seed=7, bos_id=l3.bos_id), n)
    assert got == ref[: len(got)]
    assert got.count(l3.bos_id) == got.count(l3.eos_id) + (got[-1] != l3.eos_id) > len(source)
    plain = stream_of(PackedLoader(source, l3, seq_len=SEQ, batch_size=BATCH, seed=7), n)
    assert l3.bos_id not in plain and plain == [t for t in ref if t != l3.bos_id][: len(plain)]


def test_document_ids_with_bos(source, l3):
    a, b, eos, bos = 11, 12, l3.eos_id, l3.bos_id
    row = torch.tensor([[a, eos, bos, b, b, eos, bos, a]])
    batch = make_batch(row, eos, document_masking=True, mask_eos_target=True)
    assert batch.doc_ids.tolist() == [[0, 0, 1, 1, 1, 1, 2, 2]]  # the BOS belongs to its document
    assert batch.positions.tolist() == [[0, 1, 0, 1, 2, 3, 0, 1]]
    assert batch.labels.tolist() == [[eos, IGNORE_INDEX, b, b, eos, IGNORE_INDEX, a, IGNORE_INDEX]]
    kept = make_batch(row, eos, document_masking=True, mask_eos_target=False)
    assert kept.labels[0, 1] == bos and torch.equal(kept.doc_ids, batch.doc_ids)
    # through the loader: every BOS starts a document (position 0) whose tokens follow it
    loader = PackedLoader(source, l3, seq_len=SEQ, batch_size=BATCH, seed=1, bos_id=bos, document_masking=True)
    for _ in range(20):
        batch = loader.next_batch()
        at = batch.tokens == bos
        assert (batch.positions[at] == 0).all()
        after = at[:, :-1]
        assert torch.equal(batch.doc_ids[:, 1:][after], batch.doc_ids[:, :-1][after])


@pytest.mark.parametrize("streamed", [False, True])
def test_exact_resume_mid_document_with_bos(source, l3, streamed, monkeypatch):
    """Resuming from any state inside a document (the long one included) continues exactly; with
    `streamed`, documents are read in pieces (TokenPieces) and the BOS is a piece of its own."""
    if streamed:
        monkeypatch.setattr(documents, "STREAM_CHARS", 64)
    ahead, n = 2, int(1.1 * len(bos_stream(source, l3, 11, 1)) / (SEQ * BATCH))
    base = PackedLoader(source, l3, seq_len=SEQ, batch_size=BATCH, seed=11, bos_id=l3.bos_id)
    got, states = [], [roundtrip(base.state_dict())]
    for _ in range(n + ahead):
        got.append(base.next_batch().tokens)
        states.append(roundtrip(base.state_dict()))
    assert torch.cat(got).flatten().tolist() == bos_stream(source, l3, 11, 2)[: (n + ahead) * SEQ * BATCH]
    inside = [k for k in range(n) if head_of(states[k])[2] > 0]
    long_index = len(source) - 1  # sub/long.md sorts last
    in_long = [
        k for k in inside if base.documents_for_epoch(head_of(states[k])[0])[head_of(states[k])[1]] == long_index
    ]
    assert len(in_long) >= 2
    for k in inside[:: max(1, len(inside) // 5)] + in_long[:2]:
        resumed = PackedLoader(source, l3, seq_len=SEQ, batch_size=BATCH, seed=11, bos_id=l3.bos_id)
        resumed.load_state_dict(states[k])
        for j in range(ahead):
            assert torch.equal(resumed.next_batch().tokens, got[k + j]), (k, j)
        assert resumed.state_dict() == states[k + ahead]
        resumed.close()


def test_resume_with_data_bos_changed_is_refused(source, l3):
    with_bos = PackedLoader(source, l3, seq_len=SEQ, batch_size=BATCH, seed=0, bos_id=l3.bos_id)
    without = PackedLoader(source, l3, seq_len=SEQ, batch_size=BATCH, seed=0)
    with_bos.next_batch()
    without.next_batch()
    for state, other in ((with_bos.state_dict(), without), (without.state_dict(), with_bos)):
        with pytest.raises(ValueError, match="data.bos"):
            other.load_state_dict(state)


def test_shards_and_mixtures_with_bos(tmp_path, source, l3, corpus_factory):
    """Shards hold no BOS: with data.bos they pack like the online path and take its state; in a
    mixture every document of every source begins with BOS, and resume is exact."""
    prepare_shards(OnlineDocuments(source, l3), tmp_path / "shards", docs_per_shard=16)
    shards = ShardDocuments(tmp_path / "shards", l3)
    online = PackedLoader(source, l3, seq_len=SEQ, batch_size=BATCH, seed=3, bos_id=l3.bos_id)
    stream_of(online, 10)
    state = online.state_dict()
    from_shards = PackedLoader(shards, l3, seq_len=SEQ, batch_size=BATCH, seed=3, bos_id=l3.bos_id)
    from_shards.load_state_dict(state)
    assert stream_of(from_shards, 10) == stream_of(online, 10)

    corpus_factory(tmp_path / "other", n_docs=12, seed=5, long_chars=0)
    sources = [source, TextFiles(tmp_path / "other")]
    mixed = PackedLoader(sources, l3, seq_len=SEQ, batch_size=BATCH, seed=2, weights=[0.7, 0.3], bos_id=l3.bos_id)
    streams: list[list[int]] = [[], []]  # each source's rows in order: a row holds one source's tokens
    for step in range(40):
        for source, row in zip(mixed._mixture.places(step), mixed.next_batch().tokens.tolist(), strict=True):
            streams[source] += row
    state = mixed.state_dict()
    bos, eos = l3.bos_id, l3.eos_id
    for stream in streams:
        assert stream[0] == bos and all(stream[i + 1] == bos for i, t in enumerate(stream[:-1]) if t == eos)
        assert all(stream[i - 1] == eos for i, t in enumerate(stream) if t == bos and i)
    assert min(mixed.tokens_emitted) > 0
    resumed = PackedLoader(sources, l3, seq_len=SEQ, batch_size=BATCH, seed=2, weights=[0.7, 0.3], bos_id=l3.bos_id)
    resumed.load_state_dict(roundtrip(state))
    assert stream_of(resumed, 5) == stream_of(mixed, 5)


def test_data_bos_through_the_config(corpus_dir, llama3_file, l3, tok, tmp_path):
    cfg = DataConfig(
        source=str(corpus_dir),
        tokenizer=str(llama3_file),
        bos=True,
        seq_len=SEQ,
        val_source="holdout",
        val_fraction=0.1,
    )
    assert build_loader(cfg, l3, seed=0, batch_size=2).next_batch().tokens[0, 0] == l3.bos_id
    assert Validation(cfg, l3, batch_size=2, num_batches=1).batches()[0].tokens[0, 0] == l3.bos_id
    bpe = tmp_path / "bpe.json"
    tok.save(bpe)
    with pytest.raises(ConfigError) as err:
        build_data_tokenizer(DataConfig(source=str(corpus_dir), tokenizer=str(bpe), bos=True), 512)
    assert err.value.problems[0][0] == "data.bos"
    assert str(bpe) in str(err.value) and all(c in str(err.value) for c in BOS_CANDIDATES)
    assert all(not load_config(name, None, []).data.bos for name in preset_names())  # HLAT packs EOS only


def test_hlat_train_with_llama3_tokenizer_and_bos(small_corpus, llama3_file, tok, tmp_path, capsys):
    """`hlat train` with the tokenizer file and data.bos (and document masking): 1 tiny step; a
    tokenizer without BOS is refused at start-up, naming data.bos and the file."""
    run = tmp_path / "run"
    args = tiny_args(
        small_corpus,
        run,
        "--data.tokenizer",
        str(llama3_file),
        "--data.bos",
        "true",
        "--data.document_masking",
        "true",
        "--train.steps",
        "1",
        "--train.global_batch",
        "2",
    )
    assert main(["train", *args]) == 0
    assert "bos = true" in (run / "config.toml").read_text()
    assert Tokenizer.from_file(run / "tokenizer.json").bos_token == BOS
    capsys.readouterr()
    bpe = tmp_path / "bpe.json"
    tok.save(bpe)
    refused = tiny_args(small_corpus, tmp_path / "refused", "--data.tokenizer", str(bpe), "--data.bos", "true")
    assert main(["train", *refused]) == USER_ERROR_EXIT
    err = capsys.readouterr().err
    assert "data.bos" in err and str(bpe) in err and "<|begin_of_text|>" in err
