"""Document sources and DataConfig validation."""

from __future__ import annotations

import pytest

from hlat.config.data import DataConfig
from hlat.data import BadDocument, DocumentSource, StdlibCorpus, TextFiles, open_source


def test_stdlib_corpus():
    a, b = StdlibCorpus(), StdlibCorpus()
    assert isinstance(a, DocumentSource)
    assert len(a) > 500
    assert a.relpaths == b.relpaths == sorted(a.relpaths)
    assert a.fingerprint() == b.fingerprint()
    assert not any("site-packages" in p or "__pycache__" in p for p in a.relpaths)
    assert all(p.endswith(".py") for p in a.relpaths)
    assert "os.py" in a.relpaths
    text = a[a.relpaths.index("os.py")]
    assert isinstance(text, str) and "def " in text
    assert "standard library" in a.name
    assert isinstance(open_source(DataConfig()), StdlibCorpus)


def test_text_files_directory(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.md").write_text("zed")
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "c.py").write_bytes(b"bad \xff byte")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")  # not text: ignored
    (tmp_path / ".hidden.txt").write_text("hidden")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.txt").write_text("cache")
    src = TextFiles(tmp_path)
    assert isinstance(src, DocumentSource)
    assert src.relpaths == ["a.txt", "b/z.md", "c.py"]
    assert [src[i] for i in range(2)] == ["alpha", "zed"]
    with pytest.raises(BadDocument, match=r"c\.py \(document 2\): not UTF-8.*bad_documents=skip"):
        src[2]
    fp = src.fingerprint()
    assert TextFiles(tmp_path).fingerprint() == fp
    (tmp_path / "d.txt").write_text("more")
    assert TextFiles(tmp_path).fingerprint() != fp
    with pytest.raises(IndexError):
        src[3]
    assert isinstance(open_source(DataConfig(source=str(tmp_path))), TextFiles)


def test_text_file_single(tmp_path):
    path = tmp_path / "notes"  # any suffix that is not a data format is read as text
    path.write_text("one document")
    src = TextFiles(path)
    assert len(src) == 1 and src[0] == "one document" and str(path) in src.name


def test_missing_source(tmp_path):
    with pytest.raises(ValueError, match="no such file or directory"):
        open_source(DataConfig(source=str(tmp_path / "nope")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no text files"):
        TextFiles(tmp_path / "empty")
    assert "no data or text files" in dict(DataConfig(source=str(tmp_path / "empty")).validate())["source"]


def test_validate_ok(tmp_path):
    assert DataConfig().validate() == []
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert (
        DataConfig(
            source=str(tmp_path / "a.txt"),
            tokenizer=str(tmp_path / "tokenizer.json"),
            seq_len=2,
            cache_dir=str(tmp_path / "c"),
        ).validate()
        == []
    )


def test_validate_problems(tmp_path):
    (tmp_path / "d.parquet").write_bytes(b"\0")
    (tmp_path / "file").write_text("x")
    cfg = DataConfig(
        source=str(tmp_path / "missing"),
        tokenizer=str(tmp_path / "no-tokenizer.json"),
        seq_len=1,
        max_doc_chars=0,
        tokenizer_train_chars=0,
        cache_dir=str(tmp_path / "file"),
    )
    problems = dict(cfg.validate())
    assert set(problems) == {"source", "tokenizer", "seq_len", "max_doc_chars", "tokenizer_train_chars", "cache_dir"}
    assert "no such file or directory" in problems["source"]
    assert "embedded corpus" in problems["source"]
    assert "seq_len=1" in problems["seq_len"] and "at least 2" in problems["seq_len"]
    assert "tokenizer.json" in problems["tokenizer"]
    problems = dict(DataConfig(tokenizer=str(tmp_path)).validate())
    assert "directory" in problems["tokenizer"]
    problems = dict(DataConfig(source=f"{tmp_path / 'file'},{tmp_path / 'file'}", weights="1").validate())
    assert "2 positive numbers" in problems["weights"]
    problems = dict(DataConfig(bad_documents="ignore", val_fraction=2.0).validate())
    assert set(problems) == {"bad_documents", "val_fraction"}


def test_cache_dir_default(monkeypatch, tmp_path):
    monkeypatch.setenv("HLAT_CACHE", str(tmp_path / "hc"))
    assert DataConfig().resolved_cache_dir() == tmp_path / "hc"
    monkeypatch.delenv("HLAT_CACHE")
    assert DataConfig().resolved_cache_dir().parts[-2:] == (".cache", "hlat")
    assert DataConfig(cache_dir=str(tmp_path)).resolved_cache_dir() == tmp_path
