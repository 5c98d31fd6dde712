"""hlat tokenizer train, hlat prepare, SentencePiece models, and training from each source kind."""

from __future__ import annotations

import json
import re

import pytest
import sentencepiece as spm

from hlat.cli import main
from hlat.config.data import DataConfig
from hlat.data import PackedLoader, SentencePieceTokenizer, build_tokenizer, load_tokenizer


def test_tokenizer_train_and_prepare_commands(tmp_path, corpus_dir, capsys):
    rows = tmp_path / "docs.jsonl"
    rows.write_text("".join(json.dumps({"text": p.read_text()}) + "\n" for p in sorted(corpus_dir.rglob("*.txt"))))
    assert main(["tokenizer", "train", str(rows), "--vocab-size", "300", "--out", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "300-token byte-level BPE" in out and load_tokenizer(tmp_path / "t.json").vocab_size == 300
    args = [
        "prepare", "--out", str(tmp_path / "shards"), "--docs-per-shard", "7", "--data.source", str(rows),
        "--data.tokenizer", str(tmp_path / "t.json"), "--model.vocab_size", "300",
    ]  # fmt: skip
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "prepared" in out and "uint16" in out and f"--data.source {tmp_path / 'shards'}" in out
    # progress in a log (not a terminal): a plain line per interval and at the end, no redraws
    assert "\r" not in err and re.search(r"^prepare: (\d+)/\1 doc \(100%\).*tokens [\d,]+$", err, re.M), err
    assert main(args) == 0  # already complete: nothing to redo
    assert main(["tokenizer", "train", str(tmp_path / "missing"), "--vocab-size", "300", "--out", "x"]) == 2


def test_sentencepiece_model(tmp_path, source):
    texts = [source[i] for i in range(len(source)) if source[i].strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(tmp_path / "sp"),
        vocab_size=400,
        model_type="bpe",
        byte_fallback=True,
        minloglevel=2,
    )
    tok = load_tokenizer(tmp_path / "sp.model")
    assert isinstance(tok, SentencePieceTokenizer) and tok.vocab_size == 400
    ids = tok.encode("hello world </s> café")
    assert tok.eos_id not in ids and tok.decode(ids) == "hello world </s> café"
    assert tok.encode_batch(["a b", "c"]) == [tok.encode("a b"), tok.encode("c")]
    loaded, line = build_tokenizer(DataConfig(tokenizer=str(tmp_path / "sp.model")), 512, None)
    assert "sp.model" in line and loaded.fingerprint() == tok.fingerprint()
    with pytest.raises(ValueError, match="has 400 tokens but the model's vocab_size is 300"):
        build_tokenizer(DataConfig(tokenizer=str(tmp_path / "sp.model")), 300, None)
    batch = PackedLoader(source, tok, seq_len=256, batch_size=4, seed=0).next_batch()
    assert batch.tokens.max() < 400 and (batch.tokens == tok.eos_id).any()
    (tmp_path / "bad.model").write_bytes(b"\x00not a model")
    with pytest.raises(ValueError, match="bad.model as a SentencePiece model"):
        load_tokenizer(tmp_path / "bad.model")


@pytest.mark.parametrize("kind", ["parquet", "shards"])
def test_hlat_train_from_source_kinds(tmp_path, corpus_dir, kind, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [p.read_text() for p in sorted(corpus_dir.rglob("*.txt"))]
    pq.write_table(pa.table({"text": texts}), tmp_path / "d.parquet")
    source = str(tmp_path / "d.parquet")
    common = ["--model.vocab_size", "320", "--data.seq_len", "32", "--data.cache_dir", str(tmp_path / "c")]
    if kind == "shards":
        assert main(["tokenizer", "train", source, "--vocab-size", "320", "--out", str(tmp_path / "t.json")]) == 0
        assert (
            main(
                [
                    "prepare",
                    "--out",
                    str(tmp_path / "sh"),
                    "--data.source",
                    source,
                    "--data.tokenizer",
                    str(tmp_path / "t.json"),
                    *common,
                ]
            )
            == 0
        )
        source = str(tmp_path / "sh")
    assert (
        main(
            [
                "train",
                "--train.steps",
                "2",
                "--train.log_every",
                "1",
                "--data.source",
                source,
                "--train.run_dir",
                str(tmp_path / "run"),
                "--data.document_masking",
                "true",
                *common,
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "done: step 2" in out
    assert "sample (greedy," in out.split("done: step 2")[1], out  # from shards too: their tokens, decoded
    if kind == "shards":
        assert "tokenizer: loading the token shards' tokenizer ..." in out, out


def test_each_mixture_source_names_its_own_text_field(tmp_path, corpus_dir, capsys):
    """--data.text_field content,text: one name per data.source entry, as data.weights; the run
    resumes with the same settings (the sources' fingerprints are stable), and a count that
    matches neither one nor the entries is one line, exit 2."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [p.read_text() for p in sorted(corpus_dir.rglob("*.txt"))]
    pq.write_table(pa.table({"content": texts[::2]}), tmp_path / "a.parquet")
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": t, "content": 1}) + "\n" for t in texts[1::2]))
    args = [
        "--data.source", f"{tmp_path / 'a.parquet'},{tmp_path / 'b.jsonl'}", "--data.text_field", "content, text",
        "--model.vocab_size", "320", "--data.seq_len", "32", "--data.cache_dir", str(tmp_path / "c"),
        "--train.run_dir", str(tmp_path / "run"), "--parallel.compile", "false", "--train.sample_prompt", "",
        "--model.d_model", "64", "--model.n_layers", "1", "--model.n_heads", "4", "--model.n_kv_heads", "2",
        "--model.ffn_dim", "128", "--model.max_seq_len", "64", "--train.global_batch", "4", "--train.micro_batch", "4",
        "--eval.every", "0", "--train.tensorboard", "false", "--train.plot", "false",
    ]  # fmt: skip
    assert main(["train", "--train.steps", "2", *args]) == 0
    capsys.readouterr()
    assert main(["train", "--train.steps", "3", *args]) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "done: step 3" in out, out
    assert out.index("checkpoint: loading") < out.index("resuming from")  # the load says it starts
    assert main(["train", "--train.steps", "3", *args, "--data.text_field", "content,text,body"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hlat train: invalid configuration:\n  data.text_field: 'content,text,body' names 3")
    assert err.count("\n") == 2 and "one per entry" in err, err
