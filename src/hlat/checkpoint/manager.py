"""Atomic, verified, retained checkpoints of everything a resumed run needs.

A checkpoint is a directory `step_NNNNNNNN/` holding `state.pt` (a nested dict of tensors and
plain values) and `manifest.json` (sizes and SHA-256 of every file). It is written under a
temporary name and renamed into place only once complete, so a crash mid-save leaves the previous
checkpoint as the newest valid one. Loading never executes pickled code (`weights_only=True`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

MANIFEST = "manifest.json"
STATE_FILE = "state.pt"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    pass


class CheckpointManager:
    def __init__(self, directory: Path, keep_last: int, verify: bool = True):
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.verify = verify

    def save(self, step: int, state: dict[str, Any], metadata: dict[str, Any] | None = None) -> Path:
        """Write `state` as the checkpoint of `step`, then prune to the newest `keep_last`."""
        final = self.directory / f"step_{step:08d}"
        tmp = self.directory / f".tmp-step_{step:08d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with open(tmp / STATE_FILE, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        files = {STATE_FILE: _describe(tmp / STATE_FILE)}
        manifest = {"format": FORMAT_VERSION, "step": step, "time": time.time(), "files": files, **(metadata or {})}
        _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        if final.exists():  # a re-save of the same step (e.g. after a resume) replaces it
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.directory)
        self._prune()
        return final

    def checkpoints(self) -> list[Path]:
        """Committed checkpoint directories, oldest first (validity is checked at load)."""
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.glob("step_*") if (p / MANIFEST).is_file())

    def load_latest(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that passes verification; corrupt ones are reported and skipped."""
        for path in reversed(self.checkpoints()):
            try:
                return path, self.load(path)
            except CheckpointError as err:
                print(f"warning: skipping checkpoint {path}: {err}", flush=True)
        return None

    def load(self, path: Path) -> dict[str, Any]:
        path = Path(path)
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise CheckpointError(f"unreadable {MANIFEST}: {err}") from err
        if manifest.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"format {manifest.get('format')} is not {FORMAT_VERSION}")
        for name, expected in manifest["files"].items():
            file = path / name
            if not file.is_file():
                raise CheckpointError(f"missing {name}")
            if file.stat().st_size != expected["bytes"]:
                raise CheckpointError(f"{name} has {file.stat().st_size} bytes, manifest says {expected['bytes']}")
            if self.verify and _sha256(file) != expected["sha256"]:
                raise CheckpointError(f"{name} fails its SHA-256 check (corrupt)")
        try:
            return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
        except Exception as err:  # a truncated or tampered file; never fall back to full unpickling
            raise CheckpointError(f"cannot load {STATE_FILE}: {err}") from err

    def _prune(self) -> None:
        for old in self.checkpoints()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def _describe(file: Path) -> dict[str, Any]:
    return {"bytes": file.stat().st_size, "sha256": _sha256(file)}


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_synced(file: Path, data: bytes) -> None:
    with open(file, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
