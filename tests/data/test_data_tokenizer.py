"""Tokenizer wrapper, byte-level BPE training and the tokenizer cache."""

from __future__ import annotations

import json

import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

import hlat.data.tokenizer as tokmod
from hlat.config.data import DataConfig
from hlat.data import Tokenizer, build_tokenizer, train_bpe

TEXTS = [
    "def hello(world):\n    return world * 2  # plain ASCII\n",
    "Grüße aus Köln, naïve café — «quotes» ½ ∑ Ωμέγα",
    "日本語のテキスト 中文 한국어 🙂🚀 emoji",
    "\t  tabs\tand   spaces  \n\n\r\n",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_bpe_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.eos_id not in ids


def test_bpe_basics(tok):
    assert tok.vocab_size <= 400
    assert tok.eos_token == "<|endoftext|>"
    assert tok.eos_id == tok.tk.token_to_id("<|endoftext|>")
    # no BOS or other special tokens are added, and special-token text stays text
    assert tok.encode("x") == tok.encode_batch(["x"])[0] and len(tok.encode("x")) == 1
    ids = tok.encode("a <|endoftext|> b")
    assert tok.eos_id not in ids and tok.decode(ids) == "a <|endoftext|> b"
    assert tok.decode([tok.eos_id]) == "<|endoftext|>"
    assert tok.encode_batch([]) == []


def test_bpe_is_deterministic(source):
    a = train_bpe(source, vocab_size=300, max_chars=50_000)
    b = train_bpe(source, vocab_size=300, max_chars=50_000)
    assert a.tk.to_str() == b.tk.to_str() and a.fingerprint() == b.fingerprint()


def test_bpe_vocab_too_small(source):
    with pytest.raises(ValueError, match="at least 257"):
        train_bpe(source, vocab_size=100, max_chars=1000)


def test_cache(source, tmp_path, monkeypatch):
    cfg = DataConfig(cache_dir=str(tmp_path / "cache"), tokenizer_train_chars=30_000)
    tok1, line1 = build_tokenizer(cfg, 300, source)
    assert "trained on" in line1 and "cached at" in line1 and "300 tokens" in line1
    cached = list((tmp_path / "cache" / "tokenizers").iterdir())
    assert len(cached) == 1 and cached[0].name.startswith("bpe-300-") and str(cached[0]) in line1

    def no_training(*a, **k):
        raise AssertionError("retrained although cached")

    monkeypatch.setattr(tokmod, "train_bpe", no_training)
    tok2, line2 = build_tokenizer(cfg, 300, source)
    assert "loaded from cache" in line2 and str(cached[0]) in line2
    assert tok2.fingerprint() == tok1.fingerprint()
    assert tok2.encode(TEXTS[1]) == tok1.encode(TEXTS[1])
    # another vocab size or budget is another cache entry
    monkeypatch.undo()
    _, line3 = build_tokenizer(cfg, 320, source)
    assert "trained on" in line3
    assert len(list((tmp_path / "cache" / "tokenizers").iterdir())) == 2


def test_a_cached_bpe_larger_than_the_vocabulary_is_retrained(source, tok, tmp_path):
    """A file planted at the cache path with more tokens than the model's vocabulary (its ids would
    index past the embedding) is replaced by a trained BPE, and the start-up line says so."""
    cfg = DataConfig(cache_dir=str(tmp_path / "cache"), tokenizer_train_chars=30_000)
    path = tokmod.bpe_cache_path(cfg.resolved_cache_dir(), source, 300, cfg.tokenizer_train_chars)
    tok.save(path)
    assert tok.vocab_size > 300
    trained, line = build_tokenizer(cfg, 300, source)
    assert trained.vocab_size <= 300 and Tokenizer.from_file(path).vocab_size == trained.vocab_size
    assert line.endswith(
        f"cached at {path} (replacing a cached file of {tok.vocab_size} tokens, more than vocab_size 300)"
    )


def test_user_tokenizer_json(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    cfg = DataConfig(tokenizer=str(path))
    loaded, line = build_tokenizer(cfg, 512, source=None)
    assert str(path) in line and f"{loaded.vocab_size} tokens" in line
    assert loaded.eos_id == tok.eos_id and loaded.fingerprint() == tok.fingerprint()
    assert loaded.encode(TEXTS[2]) == tok.encode(TEXTS[2])


def test_user_tokenizer_vocab_too_large(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    with pytest.raises(ValueError) as err:
        build_tokenizer(DataConfig(tokenizer=str(path)), 256, source=None)
    msg = str(err.value)
    assert str(path) in msg and str(tok.vocab_size) in msg and "256" in msg
    assert f"--model.vocab_size {tok.vocab_size}" in msg


def _word_level(tmp_path, specials):
    vocab = {w: i for i, w in enumerate(["[UNK]", "hello", "world", *specials])}
    tk = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "wl.json"
    tk.save(str(path))
    return path


def test_eos_search(tmp_path):
    tok = Tokenizer.from_file(_word_level(tmp_path, ["<s>", "</s>"]))
    assert tok.eos_token == "</s>" and tok.eos_id == 4 and tok.vocab_size == 5
    assert tok.encode("hello world") == [1, 2]  # no BOS although <s> exists
    tok = Tokenizer.from_file(_word_level(tmp_path, ["<eos>"]))
    assert tok.eos_token == "<eos>"
    tok = Tokenizer.from_file(_word_level(tmp_path, ["<|begin_of_text|>", "<|end_of_text|>"]))  # LLaMA-3
    assert tok.eos_token == "<|end_of_text|>"


def test_no_eos_is_an_error(tmp_path):
    path = _word_level(tmp_path, ["<pad>"])
    with pytest.raises(ValueError, match=r"wl\.json has no end-of-document token"):
        Tokenizer.from_file(path)


def test_not_a_tokenizer(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="bad.json"):
        Tokenizer.from_file(path)


def test_save_is_atomic_and_loadable(tok, tmp_path):
    path = tmp_path / "deep" / "dir" / "t.json"
    tok.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["t.json"]  # no temp file left
    assert Tokenizer.from_file(path).fingerprint() == tok.fingerprint()
