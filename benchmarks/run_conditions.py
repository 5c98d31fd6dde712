"""The conditions a benchmark record states beside its figures: date, hardware, versions, the
machine's load before and after, and the exact command, so that a re-run can be compared with it.
Imported by the scripts next to it (`python benchmarks/X.py` puts this folder on sys.path)."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from pathlib import Path

import torch

from hlat.metrics.cpu_peak import has_native_bf16, read_cpu_facts


class Conditions:
    """Call at the start of a measurement; `lines()` at its end."""

    def __init__(self) -> None:
        self.started = datetime.datetime.now(datetime.UTC)
        self.load_before = os.getloadavg()

    def lines(self) -> list[str]:
        facts = read_cpu_facts()
        bf16 = "native bf16 (AVX512-BF16/AMX)" if has_native_bf16(facts.flags) else "no AVX512-BF16/AMX (bf16 emulated)"
        load_after = os.getloadavg()
        command = shlex.join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])
        return [
            f"- date: {self.started:%Y-%m-%d %H:%M} UTC",
            f"- hardware: {facts.model}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads, "
            f"torch CPU capability {facts.capability}, {bf16}",
            f"- versions: Python {platform.python_version()}, torch {torch.__version__}",
            f"- load average (1/5/15 min): {_load(self.load_before)} before, {_load(load_after)} after",
            f"- command: `{command}`",
        ]


def _load(load: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.1f}" for x in load)
