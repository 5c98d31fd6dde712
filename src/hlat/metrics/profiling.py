"""`--profile.steps A:B`: a torch.profiler trace of training steps A to B, one file per rank, and
where the device's allocator keeps a history (CUDA) a memory snapshot of the same steps
(docs/training.md says how to open them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hlat.atomic_files import make_dir
from hlat.config.profile import ProfileConfig
from hlat.device.record import device_record
from hlat.device.runtime import dump_memory_snapshot, record_memory_history


class StepProfiler:
    """Starts before step A's work and stops once step B's is done (logging and saving included)."""

    def __init__(self, cfg: ProfileConfig, out_dir: Path, device: torch.device, rank: int, out: Callable[[str], None]):
        self.range, self.dir, self.device, self.rank, self.out = cfg.range(), out_dir, device, rank, out
        self._profile: Any = None
        self._done = self.range is None
        self._first = self._last = 0  # the steps the running trace covers
        self._memory = False  # the running trace records the allocator's history too

    def before_step(self, step: int) -> None:
        """Call before optimizer step `step` (1-based); stops after B, starts at A."""
        if self._done:
            return
        first, last = self.range  # type: ignore[misc]
        if self._profile is not None:
            if step > last:
                self.stop()
            else:
                self._last = max(self._last, step)  # a rollback redoes earlier steps inside the trace
        elif first <= step <= last:
            self._start(step)
        elif step > last:
            self.out(f"profile: steps {first}:{last} were already trained when this run started; nothing traced")
            self._done = True

    def _start(self, step: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        kernels = device_record(self.device.type).profiler_activity
        if kernels is not None:
            activities.append(getattr(ProfilerActivity, kernels))
        self._memory = record_memory_history(self.device, enabled=True)
        self._first = self._last = step
        self._profile = profile(activities=activities, record_shapes=True, profile_memory=True)
        self._profile.start()

    def stop(self) -> None:
        """End the trace (if one is running) and write its files, named by the steps it holds; called
        before step B + 1 and when the run ends."""
        if self._profile is None:
            return
        profile, self._profile, self._done = self._profile, None, True
        profile.stop()
        make_dir(self.dir)
        stem = f"rank{self.rank}_steps{self._first}-{self._last}"
        paths = [self.dir / f"{stem}.pt.trace.json"]
        profile.export_chrome_trace(str(paths[0]))
        if self._memory:
            paths.append(self.dir / f"{stem}_memory.pickle")
            dump_memory_snapshot(self.device, paths[1])
            record_memory_history(self.device, enabled=False)
        self.out(
            f"profile: wrote {', '.join(str(p) for p in paths)} (one set per rank; docs/training.md says how to open them)"
        )
