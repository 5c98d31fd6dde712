"""Token shards are verified when a run opens them (hlat.data.shard_check): a shard whose tokens
changed after `hlat prepare` (same size) or that holds an id past the vocabulary stops the run in
one line naming the file; a verdict is cached per node and reused while the file is unchanged, and
data.verify_shards full checks again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hlat.cli import main
from hlat.data.shard_check import VERDICTS
from hlat.digests import sha256_file
from runs import tiny_args


@pytest.fixture(scope="module")
def shards(small_corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "shards"
    args = tiny_args(small_corpus, out.parent / "unused")
    source = args[args.index("--data.source") + 1]
    assert (
        main(
            [
                "prepare",
                "--out",
                str(out),
                "--docs-per-shard",
                "50",
                "--data.source",
                source,
                "--model.vocab_size",
                "512",
            ]
        )
        == 0
    )
    return out


def _copy(shards: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "shards"
    copy.mkdir()
    for f in shards.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    return copy


def _train(source: Path, run: Path, *extra: str) -> int:
    return main(["train", *tiny_args(source, run, "--train.steps", "1", *extra)])


def _tokens(shards: Path) -> tuple[Path, np.dtype]:
    manifest = json.loads((shards / "manifest.json").read_text())
    return shards / manifest["shards"][0]["tokens"], np.dtype(manifest["dtype"])


def test_tokens_changed_after_prepare_stop_the_run_naming_the_file(shards, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HLAT_CACHE", str(tmp_path / "cache"))
    copy = _copy(shards, tmp_path)
    tokens, dtype = _tokens(copy)
    tokens.write_bytes(np.full(tokens.stat().st_size // dtype.itemsize, 7, dtype).tobytes())  # same size
    capsys.readouterr()
    assert _train(copy, tmp_path / "run") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(f"data.source: {tokens} fails its SHA-256 check (changed or corrupt since `hlat prepare`): "
                            "restore it, or run `hlat prepare` again into a new directory"), err  # fmt: skip


def test_an_id_past_the_vocabulary_is_refused_naming_the_file(shards, tmp_path, capsys, monkeypatch):
    """Ids that the manifest's digest agrees with (a shard prepared with another tokenizer and
    relabelled): the digest passes, the id bound does not."""
    monkeypatch.setenv("HLAT_CACHE", str(tmp_path / "cache"))
    copy = _copy(shards, tmp_path)
    tokens, dtype = _tokens(copy)
    ids = np.frombuffer(tokens.read_bytes(), dtype).copy()
    ids[3] = 600
    tokens.write_bytes(ids.tobytes())
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"][0]["sha256"][tokens.name] = sha256_file(tokens)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert _train(copy, tmp_path / "run") == 2
    assert f"data.source: {tokens} holds token id 600, past the vocabulary of 512 ids" in capsys.readouterr().err


def test_a_verdict_is_cached_per_file_and_a_full_check_ignores_it(shards, tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HLAT_CACHE", str(cache))
    copy = _copy(shards, tmp_path)
    assert _train(copy, tmp_path / "run1") == 0
    verdicts = sorted((cache / VERDICTS).iterdir())
    assert len(verdicts) == 2 * len(json.loads((copy / "manifest.json").read_text())["shards"])
    tokens, dtype = _tokens(copy)
    # bit rot that keeps the size and the modification time: the cached verdict cannot see it
    stat = tokens.stat()
    data = bytearray(tokens.read_bytes())
    data[0] ^= 1
    tokens.write_bytes(bytes(data))
    os.utime(tokens, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert _train(copy, tmp_path / "run2") == 0  # trusted: the documented limit of a cached verdict
    capsys.readouterr()
    assert _train(copy, tmp_path / "run3", "--data.verify_shards", "full") == 2
    assert f"{tokens} fails its SHA-256 check" in capsys.readouterr().err
    # a change that moves the modification time is seen without a full check
    tokens.write_bytes(bytes(data))
    assert _train(copy, tmp_path / "run4") == 2
