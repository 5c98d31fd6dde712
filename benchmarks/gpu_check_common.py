"""What the stages of benchmarks/gpu_check_stages.py share: the sizes of the GPU and of the CPU
dry run, and the results file each check appends a row to under its own soft deadline."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from hlat.config.model import ModelConfig

CPU = torch.device("cpu")
EOS = 0  # the synthetic batches' end-of-document token


@dataclass(frozen=True)
class Sizes:
    parity: ModelConfig  # the small model of the parity checks
    parity_batch: tuple[int, int]  # (rows, tokens per row)
    throughput: list[str]  # overrides shrinking every throughput config (none on the GPU)
    steps: int  # timed steps per throughput config (the first, compilation included, is reported apart)
    gemm: int  # the bf16 GEMM's M = N = K
    e2e_steps: int
    check_s: float  # soft deadline of one check
    accumulation: int  # micro-batches per step of the configs that accumulate (Throughput.accumulated)


PARITY_MODEL = ModelConfig(
    vocab_size=512, d_model=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=688, max_seq_len=256
)
GPU = Sizes(PARITY_MODEL, (2, 256), [], 5, 8192, 20, 150.0, 4)
DRY = Sizes(
    replace(PARITY_MODEL, d_model=64, ffn_dim=160, max_seq_len=64),
    (2, 64),
    ["--model.n_layers", "2", "--model.d_model", "64", "--model.n_heads", "4", "--model.n_kv_heads", "2",
     "--model.ffn_dim", "160", "--model.vocab_size", "512", "--model.max_seq_len", "64", "--data.seq_len", "64"],
    2,
    256,
    4,
    60.0,
    2,
)  # fmt: skip


class CheckTimeout(Exception):
    pass


class Results:
    """Appends one JSON object per check to the stage's results file, flushed at once."""

    def __init__(self, path: Path, stage: str):
        self.path, self.stage = path, stage

    def rows(self) -> list[dict[str, Any]]:
        """Every row written so far, by this stage and the ones before it."""
        text = self.path.read_text() if self.path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def add(self, check: str, status: str, **fields: Any) -> None:
        row = {"stage": self.stage, "check": check, "status": status, **fields}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    def run(self, check: str, deadline_s: float, body: Callable[[], dict[str, Any]]) -> None:
        """`body`'s fields as an ok (or its own "status") row; an error or the deadline as such a row."""
        start = time.perf_counter()
        try:
            with _alarm(deadline_s):
                fields = body()
            status = fields.pop("status", "ok")
        except CheckTimeout:
            status, fields = "timeout", {"error": f"over its {deadline_s:.0f} s deadline"}
        except Exception as err:  # noqa: BLE001  (a check's failure is its result; the next check runs)
            status, fields = "error", {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"}
        self.add(check, status, wall_s=round(time.perf_counter() - start, 2), **fields)


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    def expired(signum: int, frame: Any) -> None:
        raise CheckTimeout

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
