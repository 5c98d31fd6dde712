"""hlat.atomic_files: a file is replaced whole or not at all, and a manifest entry is checked by
size and SHA-256."""

import os
import stat

import pytest

from hlat.atomic_files import atomic_path, file_entry, file_problem, write_atomic, write_manifest
from hlat.digests import sha256_hex
from hlat.errors import UserError


def test_write_atomic_replaces_the_file_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "f.json"
    write_atomic(target, "old")
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["f.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # what a plain open gives, not 0600


def test_a_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "f"
    write_atomic(target, b"old")
    with pytest.raises(RuntimeError), atomic_path(target) as temporary:
        temporary.write_bytes(b"half")
        raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["f"]


def test_a_symbolic_link_is_refused(tmp_path):
    (tmp_path / "real").write_bytes(b"kept")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OSError, match="symbolic link") as refused:
        write_atomic(tmp_path / "link", b"new")
    assert isinstance(refused.value, UserError) and str(tmp_path / "link") in str(refused.value)  # hlat: one line
    assert (tmp_path / "real").read_bytes() == b"kept" and (tmp_path / "link").is_symlink()


def test_manifest_entries_and_their_checks(tmp_path):
    (tmp_path / "a").write_bytes(b"abc")
    entry = file_entry(tmp_path / "a")
    assert entry == {"bytes": 3, "sha256": sha256_hex(b"abc")}
    write_manifest(tmp_path / "manifest.json", {"files": {"a": entry}})
    # json.dumps(indent=1), as checkpoint and shard manifests have always been written
    assert (tmp_path / "manifest.json").read_text() == (
        '{\n "files": {\n  "a": {\n   "bytes": 3,\n   "sha256": "' + entry["sha256"] + '"\n  }\n }\n}'
    )
    assert file_problem(tmp_path, "a", entry) is None
    assert file_problem(tmp_path, "b", entry) == "missing b"
    (tmp_path / "a").write_bytes(b"abd")
    assert file_problem(tmp_path, "a", entry) == "a fails its SHA-256 check (corrupt)"
    assert file_problem(tmp_path, "a", entry, digest=False) is None
    assert file_problem(tmp_path, "a", {"sha256": entry["sha256"]}) == "a fails its SHA-256 check (corrupt)"
    (tmp_path / "a").write_bytes(b"ab")
    assert file_problem(tmp_path, "a", entry) == "a has 2 bytes, manifest says 3"
