"""Scenarios (tests/runs.py) of CheckpointManager on 2 gloo processes, without training:
test_manager.py asserts on the files they leave."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from hlat import atomic_files
from hlat.checkpoint.errors import CheckpointError
from hlat.checkpoint.manager import CheckpointManager, own_files
from runs import ScenarioContext

# (HLAT_FAULT fault, the rank it strikes, background save): every one of hlat's own save steps
FAULTS = [
    ("fail-mkdir", 0, False),
    ("fail-write", 1, False),
    ("fail-hash", 1, False),
    ("fail-commit", 0, False),
    ("fail-write", 0, True),
    ("fail-hash", 1, True),
    ("fail-commit", 0, True),
]


def _save(mgr: CheckpointManager, rank: int, step: int, background: bool = False) -> None:
    sharded = {"model": {f"w{rank}": torch.full((1000,), float(10 * step + rank))}}  # each rank its own tensor
    mgr.save(
        step,
        sharded,
        {"loader": {"rank": rank}},
        {"progress": {"step": step}} if rank == 0 else None,
        background=background,
    )


def saves_and_shared_verification(ctx: ScenarioContext) -> None:
    """A synchronous save (step 1) and a background one (step 2); then `latest` as at a resume,
    recording which files each rank hashed; then again with rank 1's shard of step 2 corrupted."""
    rank = ctx.rank
    mgr = CheckpointManager(ctx.out / "checkpoints", keep_last=None)
    _save(mgr, rank, 1)
    _save(mgr, rank, 2, background=True)
    mgr.wait()
    own = {path.name: [p.name for p in own_files(path, rank)] for path in mgr.checkpoints()}
    hashed: list[str] = []
    sha256 = atomic_files.sha256_file
    atomic_files.sha256_file = lambda file: hashed.append(str(file)) or sha256(file)
    try:
        clean = mgr.latest()
        hashed_clean = [str(Path(f).relative_to(clean)) for f in hashed]
        shard = clean / "dcp" / "__1_0.distcp"
        original = shard.read_bytes()
        dist.barrier()
        if rank == 0:
            data = bytearray(original)
            data[len(data) // 2] ^= 0xFF  # same size, wrong checksum
            shard.write_bytes(bytes(data))
        dist.barrier()
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            fallback = mgr.latest()
        dist.barrier()
        if rank == 0:
            shard.write_bytes(original)
    finally:
        atomic_files.sha256_file = sha256
    record = {
        "own": own,
        "clean": clean.name,
        "hashed": hashed_clean,
        "fallback": fallback.name,
        "printed": printed.getvalue(),
    }
    (ctx.out / f"result.rank{rank}.json").write_text(json.dumps(record))


def save_faults(ctx: ScenarioContext) -> None:
    """Each of FAULTS in turn, then a clean save; each failure must raise on both ranks. Last, a
    failure left uncaught, as a command meets it (the scenario then fails on both ranks)."""
    rank = ctx.rank
    mgr = CheckpointManager(ctx.out / "checkpoints", keep_last=None)
    results = []
    try:
        for step, (fault, failing, background) in enumerate(FAULTS, start=1):
            os.environ.update(HLAT_FAULT=f"{fault}:{step}:{failing}", HLAT_FAULT_MARKER=str(ctx.out / f"fault-{step}"))
            started = time.monotonic()
            try:
                _save(mgr, rank, step, background)
                mgr.wait()
                error = None
            except CheckpointError as err:
                error = str(err)
            results.append({"fault": fault, "rank": failing, "error": error, "seconds": time.monotonic() - started})
        del os.environ["HLAT_FAULT"]
        clean = len(FAULTS) + 1
        _save(mgr, rank, clean)
        committed = [p.name for p in mgr.checkpoints()]
        (ctx.out / f"result.rank{rank}.json").write_text(json.dumps({"faults": results, "committed": committed}))
        os.environ.update(HLAT_FAULT=f"fail-hash:{clean + 1}:1", HLAT_FAULT_MARKER=str(ctx.out / "fault-uncaught"))
        _save(mgr, rank, clean + 1)
    finally:
        for name in ("HLAT_FAULT", "HLAT_FAULT_MARKER"):
            os.environ.pop(name, None)
