"""hlat.digests: the one SHA-256 helper. The fingerprints built on it are persisted (checkpoints,
shard manifests, cache file names), so their values are pinned here as the code before the helper
computed them."""

from pathlib import Path

from hlat.data.catalog import _fingerprint as rows_fingerprint
from hlat.data.records import file_fingerprint
from hlat.data.sources import TextFiles
from hlat.digests import CHUNK_BYTES, sha256_file, sha256_hex, short_sha256


def test_sha256_of_bytes_text_and_a_streamed_file(tmp_path):
    assert sha256_hex(b"abc") == sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert short_sha256("abc") == "ba7816bf8f01cfea" and short_sha256(b"abc", 12) == "ba7816bf8f01"
    data = bytes(range(256)) * (CHUNK_BYTES // 256 + 3)  # more than one chunk, not a whole number of them
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f") == sha256_hex(data)


def test_persisted_fingerprints_keep_their_values(tmp_path):
    (tmp_path / "a.txt").write_text("héllo world\n" * 10)
    (tmp_path / "big.bin").write_bytes(bytes(range(256)) * (3 << 14))  # 12 MiB: first and last MiB sampled
    assert file_fingerprint(tmp_path / "a.txt") == "6381fb7b8047fca5"
    assert file_fingerprint(tmp_path / "big.bin") == "577c7571864a0796"
    docs = Path(tmp_path / "docs")
    docs.mkdir()
    (docs / "x.txt").write_text("one doc é\n")
    (docs / "y.txt").write_text("two\n")
    assert TextFiles(docs).fingerprint() == "textfiles-2-c643927f1d037784"
    assert rows_fingerprint("jsonl", "text", ["p1", "p2é"]) == "jsonl-2-d71cb67280e98aa9"
