"""Name the rank that slows every step down, and its host, before it costs days.

Data-parallel ranks meet at every step's gradient reduction, so one slow rank (a throttled or
faulty node) makes every rank's step as slow as its own, and wall times cannot tell which one it
is. Its compute time can: each rank times its training steps by the CPU time of its training
thread, which grows with the work it does and not while it waits for the others in a collective.
On each logging step one all_gather of those times (the only collective this adds) reaches rank 0,
which keeps a rolling score per rank and names a rank that stays slow, with its host. Ranks are
compared with the ranks of their pipeline stage only: stages do different work by design.

The CPU-time clock measures compute on CPU ranks only: on CUDA the host thread only launches
kernels, so the report is off there (a per-kernel timing would be needed).
"""

from __future__ import annotations

import socket
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hlat.parallel.mesh import Layout

# all_gather_single replaces all_gather_into_tensor, which warns as deprecated from torch 2.13 (on every
# rank, again after each checkpoint: its save resets the warning filters); older torch has only the latter
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class Verdict:
    """One logging window, as rank 0 judges it."""

    slowest: int  # the rank with the largest relative lag in this window
    lag_s: float  # its compute per step minus the median of its stage's ranks
    score: float  # its rolling score (see SlowRankScores)
    median_s: float  # that median, in seconds per step
    became_slow: list[int]  # ranks whose lag has just exceeded the threshold for `windows` windows in a row
    recovered: list[int]  # ranks named slow before that are back within the threshold


@dataclass
class SlowRankScores:
    """Each rank's lag in a window is relative to the median rank of its pipeline stage:
    (compute - median) / median per step. A rank is named slow once its lag has exceeded `threshold`
    for `windows` windows in a row (one slow window, a spike, is not enough), and named once per
    episode: the episode ends when its lag is back within the threshold and so is its score, an
    exponential moving average of its lags (span `windows`), so that a rank slow in most windows is
    not named again and again."""

    threshold: float
    windows: int
    scores: list[float] = field(default_factory=list)
    streaks: list[int] = field(default_factory=list)  # windows in a row with the lag above the threshold
    slow: set[int] = field(default_factory=set)
    medians: list[float] = field(default_factory=list)  # the last window's median of each rank's stage

    def update(self, compute_s: Sequence[float], stages: Sequence[int] | None = None) -> Verdict:
        """Score one window from each rank's compute seconds per step and pipeline stage (index = rank;
        no stages: one stage)."""
        stages = stages or [0] * len(compute_s)
        median = {stage: statistics.median(c for c, s in zip(compute_s, stages) if s == stage) for stage in set(stages)}
        self.medians = [median[stage] for stage in stages]
        relative = [(c - m) / m if m > 0 else 0.0 for c, m in zip(compute_s, self.medians)]
        if not self.scores:
            self.scores, self.streaks = list(relative), [0] * len(relative)
        else:
            weight = 2 / (self.windows + 1)  # the usual span-N average: recent windows count most
            self.scores = [s + weight * (r - s) for s, r in zip(self.scores, relative)]
        became, recovered = [], []
        for rank, (lag, score) in enumerate(zip(relative, self.scores)):
            self.streaks[rank] = self.streaks[rank] + 1 if lag > self.threshold else 0
            if self.streaks[rank] >= self.windows and rank not in self.slow:
                self.slow.add(rank)
                became.append(rank)
            elif rank in self.slow and self.streaks[rank] == 0 and score <= self.threshold:
                self.slow.remove(rank)
                recovered.append(rank)
        slowest = max(range(len(compute_s)), key=lambda r: relative[r])
        median_s = self.medians[slowest]
        return Verdict(slowest, compute_s[slowest] - median_s, self.scores[slowest], median_s, became, recovered)


class SlowRankReport:
    """The report over the whole world (collective: every rank builds it and calls `window` on the
    same logging steps). Off in single-process runs and on devices other than the CPU."""

    def __init__(self, layout: Layout, device: torch.device, threshold: float, windows: int):
        self.enabled = layout.world > 1 and device.type == "cpu"
        self.is_main = layout.is_main
        self.scores = SlowRankScores(threshold, windows)
        self.hosts: list[str] = []
        self.stages: list[int] = []
        if self.enabled:  # once, at start-up: a slow rank is reported with its host
            every: list[tuple[str, int]] = [("", 0)] * layout.world
            dist.all_gather_object(every, (socket.gethostname(), layout.pp_rank))
            self.hosts, self.stages = [host for host, _ in every], [stage for _, stage in every]

    def window(self, compute_s: float, steps: int) -> tuple[dict[str, float | int], list[str]]:
        """Gather every rank's compute seconds over this window of `steps` steps; on rank 0, return
        the record's fields and a console line for each rank that became slow or recovered."""
        if not self.enabled:
            return {}, []
        mine = torch.tensor([compute_s / steps], dtype=torch.float64)
        every = torch.empty(len(self.hosts), dtype=torch.float64)
        _all_gather_tensor(every, mine)
        if not self.is_main:
            return {}, []
        verdict = self.scores.update(every.tolist(), self.stages)
        lines = [self._slow_line(rank) for rank in verdict.became_slow]
        lines += [
            f"slow rank: rank {rank} on host {self.hosts[rank]} is back within {self.scores.threshold:.0%} of the median"
            for rank in verdict.recovered
        ]
        fields = {
            "slowest_rank": verdict.slowest,
            "slowest_lag_s": verdict.lag_s,
            "slowest_score": verdict.score,
            "median_compute_s": verdict.median_s,
        }
        return fields, lines

    def _slow_line(self, rank: int) -> str:
        scores = self.scores
        peers = "the median rank" + (f" of pipeline stage {self.stages[rank]}" if max(self.stages) else "")
        return (
            f"slow rank: rank {rank} on host {self.hosts[rank]} has computed more than {scores.threshold:.0%} longer per "
            f"step than {peers} ({scores.medians[rank]:.3f} s) for {scores.windows} log windows in a row (rolling score "
            f"{scores.scores[rank]:.0%}; train.slow_rank_threshold, train.slow_rank_windows); every step waits for it: "
            "drain its node and restart from the last checkpoint (docs/operations.md: slow ranks)"
        )
