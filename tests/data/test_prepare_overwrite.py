"""hlat prepare writes into a new or empty directory or resumes its own; anything else needs
--overwrite, which removes only prepare's own files (hlat.output_dir)."""

from __future__ import annotations

import json

from hlat.cli import USER_ERROR_EXIT, main


def test_prepare_refuses_a_foreign_or_different_directory(tmp_path, corpus_dir, capsys):
    rows = tmp_path / "docs.jsonl"
    rows.write_text("".join(json.dumps({"text": p.read_text()}) + "\n" for p in sorted(corpus_dir.rglob("*.txt"))))
    assert main(["tokenizer", "train", str(rows), "--vocab-size", "300", "--out", str(tmp_path / "t.json")]) == 0
    out = tmp_path / "shards"
    out.mkdir()
    (out / "tokenizer.json").write_text("the user's own tokenizer")

    def prepare(*extra: str) -> int:
        capsys.readouterr()
        return main([
            "prepare", "--out", str(out), "--data.source", str(rows), "--data.tokenizer", str(tmp_path / "t.json"),
            "--model.vocab_size", "300", *extra,
        ])  # fmt: skip

    assert prepare() == USER_ERROR_EXIT
    assert "is not empty and holds no hlat shards" in capsys.readouterr().err
    assert (out / "tokenizer.json").read_text() == "the user's own tokenizer"  # untouched
    (out / "notes.txt").write_text("mine")
    assert prepare("--overwrite") == USER_ERROR_EXIT  # --overwrite removes prepare's own files only
    assert "holds files hlat prepare does not write (notes.txt)" in capsys.readouterr().err
    assert (out / "tokenizer.json").read_text() == "the user's own tokenizer"
    (out / "notes.txt").unlink()
    assert prepare("--overwrite") == 0
    assert prepare() == 0  # its own output, made the same way: resumed (here: already complete)
    assert prepare("--docs-per-shard", "7") == USER_ERROR_EXIT
    assert "or give --overwrite to replace them" in capsys.readouterr().err
    assert prepare("--docs-per-shard", "7", "--overwrite") == 0
    assert json.loads((out / "manifest.json").read_text())["docs_per_shard"] == 7
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("tokens-")) == [
        f"tokens-{k:05d}.bin" for k in range(len(json.loads((out / "manifest.json").read_text())["shards"]))
    ]
